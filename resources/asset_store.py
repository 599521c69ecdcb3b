"""The IO manager of the binding assets: one pickle per binding partition, many partitions per run.

A partitioned asset value is a dict binding id -> value (assets.batch). It is stored one file per
partition at `<instance storage>/<asset>/<binding id>`, where Dagster's own filesystem IO manager
keeps partitioned values, and loaded back as such a dict for whatever partitions the reading step
covers: a one-binding `solve` run reads the calibration a 100-binding refresh wrote.
"""

import pickle
from typing import Any, Mapping

from dagster import ConfigurableIOManagerFactory, InitResourceContext, InputContext, OutputContext, UPathIOManager
from upath import UPath


class PerBindingPickleIOManager(UPathIOManager):
    extension = ""

    def dump_to_path(self, context: OutputContext, obj: Any, path: UPath) -> None:
        with path.open("wb") as file:
            pickle.dump(obj, file, pickle.HIGHEST_PROTOCOL)

    def load_from_path(self, context: InputContext, path: UPath) -> Any:
        with path.open("rb") as file:
            return pickle.load(file)

    def handle_output(self, context: OutputContext, obj: Any) -> None:
        if not context.has_asset_partitions:
            return super().handle_output(context, obj)
        paths = self._get_paths_for_partitions(context)
        if not isinstance(obj, Mapping) or set(obj) != set(paths):
            raise TypeError(f"{context.asset_key.to_user_string()}: a binding asset returns a dict with one value "
                            f"per partition of the run {sorted(paths)}, got {type(obj).__name__}")
        for binding_id, path in paths.items():
            self.make_directory(path.parent)
            self.dump_to_path(context=context, obj=obj[binding_id], path=path)

    def load_input(self, context: InputContext) -> Any:
        if not context.has_asset_partitions:
            return super().load_input(context)
        return {binding_id: self.load_from_path(context=context, path=path)
                for binding_id, path in self._get_paths_for_partitions(context).items()}


class BindingsIOManager(ConfigurableIOManagerFactory):
    """`PerBindingPickleIOManager` under the Dagster instance's storage directory."""

    def create_io_manager(self, context: InitResourceContext) -> PerBindingPickleIOManager:
        return PerBindingPickleIOManager(base_path=UPath(context.instance.storage_directory()))

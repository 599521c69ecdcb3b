"""Dagster resources over the home directory: the ledger and the settings it is read with."""

from pathlib import Path

from dagster import ConfigurableResource

from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import Settings, ledger_path, load_settings


class LedgerResource(ConfigurableResource):
    """The home's append-only DuckDB ledger; every call opens one short transaction under the
    cross-process lock, so step processes, sensors and the CLI can share it."""

    home: str

    def ledger(self) -> Ledger:
        return Ledger(ledger_path(Path(self.home)))

    def settings(self) -> Settings:
        return load_settings(Path(self.home))

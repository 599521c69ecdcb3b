"""Dagster resources over the home directory: the ledger (the one store of the binding assets) and
the settings."""

from pathlib import Path

from dagster import ConfigurableResource

from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.settings import Settings, ledger_path, load_settings


class LedgerResource(ConfigurableResource):
    """The home's append-only ledger. Every call opens one short transaction (the DuckDB file's
    lock is shared by step processes, sensors and the CLI); a step over many bindings holds one
    session across them (assets.batch.in_ledger_sessions)."""

    home: str

    def ledger(self) -> Ledger:
        return Ledger(ledger_path(Path(self.home)))


class SettingsResource(ConfigurableResource):
    """`<home>/settings.yaml` with its environment overrides, read when a run or sensor asks."""

    home: str

    def get(self) -> Settings:
        return load_settings(Path(self.home))

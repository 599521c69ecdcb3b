"""Dagster resources over the home directory: the ledger (the one store of the binding assets) and
the settings."""

from pathlib import Path

from dagster import ConfigurableResource

from optimizer_pipeline.ledger import Ledger, open_ledger
from optimizer_pipeline.settings import Settings, load_settings


class LedgerResource(ConfigurableResource):
    """The home's append-only ledger: the DuckDB file (its lock shared by step processes, sensors
    and the CLI) or PostgreSQL when `ledger.url` is set. Every call is one short transaction; a
    step over many bindings holds one session across them (assets.batch.in_ledger_sessions)."""

    home: str

    def ledger(self) -> Ledger:
        return open_ledger(Path(self.home))


class SettingsResource(ConfigurableResource):
    """`<home>/settings.yaml` with its environment overrides, read when a run or sensor asks."""

    home: str

    def get(self) -> Settings:
        return load_settings(Path(self.home))

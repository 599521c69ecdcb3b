"""Dagster resource reading plant history and bindings from the home's ledger."""

from pathlib import Path
from typing import Sequence

import pandas as pd
from dagster import ConfigurableResource

from optimizer_pipeline.contracts import EvidenceSource
from optimizer_pipeline.ledger import Ledger, StoredBinding
from optimizer_pipeline.settings import ledger_path


class PlantStoreResource(ConfigurableResource):
    """Bindings (latest revision) and their stored plant samples (`plant_samples`)."""

    home: str

    def _ledger(self) -> Ledger:
        return Ledger(ledger_path(Path(self.home)))

    def binding(self, binding_id: str) -> StoredBinding:
        return self._ledger().get_binding(binding_id)

    def bindings(self) -> list[StoredBinding]:
        return self._ledger().list_bindings()

    def bindings_by_id(self, binding_ids: Sequence[str]) -> dict[str, StoredBinding]:
        """The latest revision of each binding, in the order given, read in one ledger transaction
        (a step covering many partitions); an id not in the ledger raises NotFoundError."""
        ledger = self._ledger()
        stored = {b.spec.id: b for b in ledger.list_bindings()}
        return {b: stored[b] if b in stored else ledger.get_binding(b) for b in binding_ids}

    def history(self, stored: StoredBinding) -> pd.DataFrame:
        return self._ledger().history_frame(stored.spec.id, stored.spec.tags)

    def source(self, binding_id: str) -> str:
        """`simulation` for demo-plant data, `real` for ingested plant history."""
        return self._ledger().sample_source(binding_id) or EvidenceSource.REAL.value

"""A demo home materialized through real Dagster (shared by the pipeline tests of one module)."""

from dataclasses import dataclass
from pathlib import Path

from dagster import DagsterInstance

from optimizer_pipeline.assets.compat import range_tags
from optimizer_pipeline.definitions import build_definitions
from optimizer_pipeline.ledger import Ledger
from optimizer_pipeline.contracts import binding_from_dict
from optimizer_pipeline.plants import Plant, demo_plants, get_plant
from optimizer_pipeline.resources.solver import InProcessSolverResource
from optimizer_pipeline.settings import ledger_path

SEED = 1
# The demo histories end when they are seeded (plant.history: its newest sample at the current time), and a
# recommendation is `verified` only while that live state is younger than live.max_age_s (300 s for every
# demo plant). A module that seeds a home once and decides again in later tests runs past that on a loaded
# machine (tests/test_pipeline_e2e.py and tests/test_whatif.py take ~70 s quiet, 2.5 x that at load 3);
# their subject is not the live state's age (tests/test_decision_matrix.py and test_pipeline_e2e's
# eleven-months test are), so such a home allows a day, as tests/test_several_hosts.py does.
LIVE_AGE_S = 86_400.0


@dataclass
class DemoHome:
    home: Path
    ledger: Ledger
    instance: DagsterInstance
    plants: dict[str, Plant]

    in_process_solver: bool = False  # the FAKE solver, for tests whose subject is not the worker pool

    def defs(self):
        return build_definitions(self.home, solver=InProcessSolverResource() if self.in_process_solver else None)

    def run(self, binding_id: str, job: str = "refresh"):
        result = self.defs().resolve_job_def(job).execute_in_process(
            partition_key=binding_id, instance=self.instance, raise_on_error=True)
        assert result.success
        return result

    def run_range(self, first: str, last: str, job: str = "refresh"):
        """One run over the binding partitions first..last (as the CLI and the schedule launch it)."""
        result = self.defs().resolve_job_def(job).execute_in_process(
            instance=self.instance, tags=range_tags(first, last), raise_on_error=True)
        assert result.success
        return result


def allow_live_age(home: Path, seconds: float = LIVE_AGE_S) -> None:
    """`live.max_age_s: seconds` in the home's settings.yaml (created; the home must not have one yet)."""
    import yaml

    path = Path(home) / "settings.yaml"
    assert not path.exists(), f"{path} exists: add live.max_age_s to it instead"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"live": {"max_age_s": seconds}}), encoding="utf-8")


def seed_home(home: Path, plants: list[Plant] | None = None) -> Ledger:
    ledger = Ledger(ledger_path(home))
    for plant in plants or demo_plants():
        ledger.ingest(plant.spec, plant.history(SEED).frame, "simulation")
    return ledger


def seed_one_unidentifiable(home: Path) -> Ledger:
    """Two good heater bindings (good-a, good-b) and one whose history is a single short run (bad-c:
    unidentifiable, its first stage fails)."""
    plant, ledger = get_plant("heater"), Ledger(ledger_path(home))
    frame = plant.history(1).frame
    for binding_id in ("good-a", "good-b"):
        ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": binding_id}), frame, "simulation")
    short = frame[frame["run_id"] == frame["run_id"].iloc[0]].head(40)
    ledger.ingest(binding_from_dict({**plant.binding_doc(), "id": "bad-c"}), short, "simulation")
    return ledger

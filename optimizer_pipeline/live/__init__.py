"""The resident live service: re-solves bindings within milliseconds of their new samples
(optimizer_pipeline/live/service.py), with the sample sources behind one interface (sources.py) and
each binding kept warm (served.py). No Dagster import: the Dagster side is a Reporter it is given."""

from optimizer_pipeline.live.served import Served
from optimizer_pipeline.live.service import HEARTBEAT_STALE_S, LEASE_S, LiveService, Published, Reporter, State
from optimizer_pipeline.live.sources import InboxSource, LedgerSource, SampleSource

__all__ = ["HEARTBEAT_STALE_S", "LEASE_S", "InboxSource", "LedgerSource", "LiveService", "Published", "Reporter",
           "SampleSource", "Served", "State"]

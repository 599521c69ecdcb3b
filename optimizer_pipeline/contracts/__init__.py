"""Contracts: the frozen vocabulary of the product (docs/ARCHITECTURE.md, "Vocabulary") and its canonical JSON.

One module per group of words; every name is re-exported here, so `from
optimizer_pipeline.contracts import X` is the one way to use them:

  canonical       canonical JSON, fast_json, all_finite, sha256 / content hash, ContractError
  timeutil        utc_now, as_utc, iso_utc, iso_from_seconds, parse_iso_utc
  transform       CVTransform (a saturating CV's logit) and its column-wise forward / inverse
  wiring          a binding's OPC UA wiring: OpcUaWiring, AdvisoryWiring, NodeIds, wiring_from_json
  binding         Template, MV / CV / DV specs, ModelSettings, Profile, BindingSpec and its loaders, StoredBinding
  history         RunSeries, HistorySplit, Exclusion
  model           Normalisation, StateSpace, Gate, ModelArtifact, MIN_STD
  problem         ProblemIR
  solve           CandidateKind, SolveCandidate, SolveResult
  evidence        BlockScores, UQEvidence, Scores (val / test), Calibration (stored evidence)
  recommendation  RecommendationStatus, EvidenceSource, Condition, Recommendation, EvidenceSnapshot
  outcome         OutcomeVerdict, Outcome

Units are stated per field. "Engineering units" are the plant's own; "normalised units" are
z = (x - mean) / std with the train statistics of the model artifact.
"""

from optimizer_pipeline.contracts.binding import (
    ID_PATTERN,
    BindingSpec,
    CVSpec,
    DVSpec,
    ModelSettings,
    MVSpec,
    Profile,
    Template,
    binding_from_dict,
    binding_from_json,
    StoredBinding,
    load_binding_file,
)
from optimizer_pipeline.contracts.canonical import (
    ContractError,
    _canonical,  # the definition canonical_json is tested against (tests/test_contracts.py)
    all_finite,
    canonical_json,
    content_hash,
    fast_json,
    sha256_hex,
)
from optimizer_pipeline.contracts.evidence import (MIN_EMPIRICAL_VAL_BLOCKS, MIN_TEST_RUNS, MIN_UNIQUE_TEST_STEPS,
                                                   BlockScores, Calibration, Scores, UQEvidence)
from optimizer_pipeline.contracts.history import Exclusion, HistorySplit, RunSeries
from optimizer_pipeline.contracts.model import MIN_STD, Gate, ModelArtifact, Normalisation, StateSpace
from optimizer_pipeline.contracts.outcome import Outcome, OutcomeVerdict
from optimizer_pipeline.contracts.problem import ProblemIR
from optimizer_pipeline.contracts.recommendation import (
    Condition,
    EvidenceSnapshot,
    EvidenceSource,
    Recommendation,
    RecommendationStatus,
)
from optimizer_pipeline.contracts.solve import CandidateKind, SolveCandidate, SolveResult
from optimizer_pipeline.contracts.timeutil import as_utc, iso_from_seconds, iso_utc, parse_iso_utc, utc_now
from optimizer_pipeline.contracts.transform import CVTransform, forward_columns, inverse_columns
from optimizer_pipeline.contracts.wiring import AdvisoryWiring, NodeIds, OpcUaWiring, wiring_from_json

__all__ = [
    "AdvisoryWiring", "BindingSpec", "BlockScores", "CVSpec", "CVTransform", "Calibration", "CandidateKind",
    "Condition", "ContractError", "DVSpec", "EvidenceSnapshot", "EvidenceSource", "Exclusion", "Gate", "HistorySplit",
    "ID_PATTERN",
    "MIN_EMPIRICAL_VAL_BLOCKS", "MIN_STD", "MIN_TEST_RUNS", "MIN_UNIQUE_TEST_STEPS", "MVSpec", "ModelArtifact",
    "ModelSettings", "NodeIds", "Normalisation", "OpcUaWiring", "Outcome",
    "OutcomeVerdict", "ProblemIR", "Profile", "Recommendation", "RecommendationStatus", "RunSeries", "Scores",
    "SolveCandidate", "SolveResult", "StateSpace", "StoredBinding", "Template", "UQEvidence", "all_finite",
    "as_utc", "binding_from_dict", "binding_from_json", "canonical_json", "content_hash", "fast_json", "forward_columns",
    "inverse_columns", "iso_from_seconds", "iso_utc", "load_binding_file", "parse_iso_utc", "sha256_hex", "utc_now",
    "wiring_from_json",
]

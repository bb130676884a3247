"""History: the per-step schema, the crash-safe artifact, the RAM ring and exact merges.

Write with :class:`HistoryWriter`; read a run with :func:`stepscope.open_run` (the one reader
entry point, above this layer: it adds the run log's evaluations and clocks).
"""

from stepscope.history.artifact import HistoryWriter
from stepscope.history.batch import ObservationBatch, batches_from_records
from stepscope.history.discover import find_runs, is_run_dir, runs_at
from stepscope.history.fingerprint import model_fingerprint
from stepscope.history.merge import fold_micro_batches, merge_batches, merge_ranks
from stepscope.history.pending import CloseReport
from stepscope.history.ring import RingBlock, RingPolicy, StepRing, coarsen_pair
from stepscope.history.runrecord import FORMAT, SCHEMA_VERSION, RunRecord
from stepscope.history.schema import ObservationRecord, SiteRecord, StepBlockRecord, StepTruth
from stepscope.history.series import HistogramSeries, Series
from stepscope.history.verify import VerifyReport
from stepscope.history.versions import pick_run
from stepscope.history.vocab import Phase, Presence, ScaleGrad, StepProvenance, Stream, Tristate
from stepscope.stats.layout import merge_spine_rows

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "CloseReport",
    "HistogramSeries",
    "HistoryWriter",
    "ObservationBatch",
    "ObservationRecord",
    "Phase",
    "Presence",
    "RingBlock",
    "RingPolicy",
    "RunRecord",
    "ScaleGrad",
    "Series",
    "SiteRecord",
    "StepBlockRecord",
    "StepProvenance",
    "StepRing",
    "StepTruth",
    "Stream",
    "Tristate",
    "VerifyReport",
    "batches_from_records",
    "coarsen_pair",
    "find_runs",
    "fold_micro_batches",
    "is_run_dir",
    "merge_batches",
    "merge_ranks",
    "merge_spine_rows",
    "model_fingerprint",
    "pick_run",
    "runs_at",
]

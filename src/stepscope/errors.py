"""One exception type, :class:`Refusal`, and the whole code vocabulary.

Every user-facing failure in stepscope raises :class:`Refusal` with a stable snake_case ``code``
(never renamed once released), a message that says what happened, and remedies that say what the
user can do. The vocabulary lives here, in one table: :class:`Code` holds each code's meaning, its
:class:`Family` and, where one is obvious, a default remedy (used when a raise site gives none).
Raising an unknown code is a programming error that is itself caught by the test suite.

Each code belongs to exactly one family, and ``Refusal(code, ...)`` returns an instance of the
family's class, so ordinary ``except`` clauses catch refusals too:

* :attr:`Family.INPUT` -> :class:`RefusalInputError`, also a :class:`ValueError` (a bad argument,
  file content or configuration supplied by the user);
* :attr:`Family.STORAGE` -> :class:`RefusalStorageError`, also an :class:`OSError` (the artifact or
  output directory on disk is damaged, missing, locked, taken or unwritable);
* :attr:`Family.STATE` -> plain :class:`Refusal` (the call came at the wrong moment: a closed
  object, a nested profiler session, a condition that did not hold).

Example
-------
>>> from stepscope import Refusal
>>> try:
...     raise Refusal("selection_empty", "no module matched 'Conv*'", remedies=["check the names"])
... except ValueError as err:  # a bad-input refusal is a ValueError too
...     err.code, isinstance(err, Refusal)
('selection_empty', True)
>>> Code.HISTORY_DISK_FAULT.family, Code("history_disk_fault") is Code.HISTORY_DISK_FAULT
(<Family.STORAGE: 'storage'>, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from enum import Enum
from typing import Any


class Family(str, Enum):
    """Which ordinary exception a refusal also is (see the module docstring)."""

    INPUT = "input"
    STORAGE = "storage"
    STATE = "state"

    def __str__(self) -> str:
        return self.value


_INPUT, _STORAGE, _STATE = Family.INPUT, Family.STORAGE, Family.STATE


class Code(str, Enum):
    """Every refusal code: ``Code.X.value`` is the stable string users and tests match on.

    Each member carries ``description`` (one line), ``family`` (:class:`Family`) and ``remedy``
    (a default remedy sentence, or None when the raise site must say what to do). A ``Code``
    compares equal to its string value, so ``Refusal`` accepts either.
    """

    description: str
    family: Family
    remedy: str | None

    def __new__(
        cls, value: str, family: Family, description: str, remedy: str | None = None
    ) -> Code:
        member = str.__new__(cls, value)
        member._value_ = value
        member.family = family
        member.description = description
        member.remedy = remedy
        return member

    def __str__(self) -> str:
        return self.value

    # kernels
    STAT_DTYPE_UNSUPPORTED = (
        "stat_dtype_unsupported",
        _INPUT,
        "the tensor dtype cannot be reduced (e.g. complex)",
        "cast the tensor to a real floating dtype before reducing it",
    )
    # "sketch" is the seeds' word for the histogram, kept in this one stable code string
    SKETCH_DESCRIPTOR_MISMATCH = (
        "sketch_descriptor_mismatch",
        _INPUT,
        "two histograms with different descriptors were merged",
    )
    DESCRIPTOR_INVALID = (
        "descriptor_invalid",
        _INPUT,
        "a histogram descriptor has inconsistent or unsupported fields",
    )
    STAT_PAYLOAD_INVALID = (
        "stat_payload_invalid",
        _INPUT,
        "a serialised statistic is malformed or inconsistent",
    )
    STAT_KIND_MISMATCH = (
        "stat_kind_mismatch",
        _INPUT,
        "statistics of different kinds were combined",
    )
    # selection / dataset mode
    SELECTION_EMPTY = (
        "selection_empty",
        _INPUT,
        "a site selection matched nothing",
        "list the model's names with `[n for n, _ in model.named_modules()]` and fix the pattern",
    )
    SELECTION_INVALID = ("selection_invalid", _INPUT, "a site selection is of an unsupported form")
    STAT_UNKNOWN = ("stat_unknown", _INPUT, "a statistic name is not known")
    # history artifact
    HISTORY_ARTIFACT_CORRUPT = (
        "history_artifact_corrupt",
        _STORAGE,
        "a committed chunk or index row fails its checksum",
        "restore the artifact from a copy; run `stepscope verify` to list all damage",
    )
    HISTORY_ARTIFACT_MISSING = (
        "history_artifact_missing",
        _STORAGE,
        "the path holds no stepscope artifact or a referenced file is absent",
        "check the path points at a stepscope artifact directory",
    )
    HISTORY_JSON_INVALID = (
        "history_json_invalid",
        _STORAGE,
        "a manifest/catalog/index file is malformed or truncated",
    )
    HISTORY_CHUNK_NAME_INVALID = (
        "history_chunk_name_invalid",
        _STORAGE,
        "an index names a chunk outside the chunk directory",
    )
    HISTORY_SCHEMA_UNSUPPORTED = (
        "history_schema_unsupported",
        _STORAGE,
        "the artifact's schema version is not readable by this version",
        "read the artifact with the stepscope version that wrote it",
    )
    HISTORY_WRITER_CLOSED = (
        "history_writer_closed",
        _STATE,
        "the writer was used after close()",
        "open a new writer (resume=True to continue the run)",
    )
    HISTORY_RUN_EXISTS = (
        "history_run_exists",
        _STORAGE,
        "a new run was started on an existing run without resume",
        "pass resume=True to continue the run, or choose a new directory",
    )
    HISTORY_SERIES_UNKNOWN = (
        "history_series_unknown",
        _INPUT,
        "a site, stream or field that the artifact does not hold",
    )
    PRESENCE_PAYLOAD_FORBIDDEN = (
        "presence_payload_forbidden",
        _INPUT,
        "a non-observed presence carried a payload",
    )
    SCALE_GRAD_REQUIRED = (
        "scale_grad_required",
        _INPUT,
        "a gradient-stream record lacks its scale_grad provenance",
    )
    RING_CAPACITY_EXHAUSTED = (
        "ring_capacity_exhausted",
        _STATE,
        "the RAM ring is full under the refuse policy",
    )
    MERGE_INCOMPATIBLE = (
        "merge_incompatible",
        _INPUT,
        "segments that cannot be merged (runs, steps or layouts differ)",
    )
    HISTORY_STEP_OUT_OF_ORDER = (
        "history_step_out_of_order",
        _INPUT,
        "a step block was written at or before an already written step",
    )
    HISTORY_WRITER_ACTIVE = (
        "history_writer_active",
        _STORAGE,
        "another live writer holds the artifact's writer lock",
        "close the other writer first, or write to another directory",
    )
    RESUME_FINGERPRINT_MISMATCH = (
        "resume_fingerprint_mismatch",
        _INPUT,
        "a resumed run's model architecture differs from the artifact's",
    )
    RESUME_DESCRIPTOR_MISMATCH = (
        "resume_descriptor_mismatch",
        _INPUT,
        "a resumed run's histogram descriptor differs from the artifact's",
    )
    HISTORY_FILE_KIND_INVALID = (
        "history_file_kind_invalid",
        _STORAGE,
        "an artifact path is a link, directory, FIFO or device, not a regular file",
        "replace the path with a regular file; stepscope does not follow links",
    )
    HISTORY_DISK_FAULT = (
        "history_disk_fault",
        _STORAGE,
        "a commit failed on a full or read-only disk; rows kept pending or disclosed",
        "free disk space or remount the output read-write; training continues",
    )
    HISTORY_INDEX_INCOMPLETE = (
        "history_index_incomplete",
        _STORAGE,
        "the index accounts for fewer commits or evaluations than the artifact holds",
    )
    HISTORY_QUERY_INVALID = (
        "history_query_invalid",
        _INPUT,
        "a reader query has a malformed step range or micro-batch",
    )
    RUN_AMBIGUOUS = (
        "run_ambiguous",
        _INPUT,
        "a folder given as one run holds several runs that are not versions of one name",
    )
    HISTORY_SITE_NAME_REQUIRED = (
        "history_site_name_required",
        _INPUT,
        "a reader was given a bare int where a site name (or a Site record) is meant",
    )
    HISTORY_ARTIFACT_INCONSISTENT = (
        "history_artifact_inconsistent",
        _STORAGE,
        "checksums hold but the artifact contradicts itself (steps, streams, sites or sequence)",
        "restore the artifact from a copy; run `stepscope verify` to list every inconsistency",
    )
    HISTORY_WRITE_INVALID = (
        "history_write_invalid",
        _INPUT,
        "a writer argument has the wrong type or is out of range (it would corrupt the run)",
    )
    HISTORY_OUTPUT_UNWRITABLE = (
        "history_output_unwritable",
        _STORAGE,
        "the run directory cannot be created or written (bad name, a file in the way, full or "
        "read-only disk)",
        "pass an output directory on a writable disk, a plain path without NUL",
    )
    # collector
    COLLECTOR_IN_MEMORY = (
        "collector_in_memory",
        _STATE,
        "a run directory was asked of a collector that records to RAM only (in_memory=True)",
    )
    OPTIMIZER_FOREIGN = (
        "optimizer_foreign",
        _INPUT,
        "step() was given an optimizer that holds none of the watched model's parameters",
    )
    STEP_TRANSACTION_REQUIRED = (
        "step_transaction_required",
        _STATE,
        "an operation needs the explicit step() transaction",
    )
    STEP_TRANSACTION_NESTED = (
        "step_transaction_nested",
        _STATE,
        "a step transaction was opened inside another",
        "close the open step() before opening another",
    )
    COLLECTOR_CLOSED = (
        "collector_closed",
        _STATE,
        "the collector was used after close()",
        "create a new collector",
    )
    STREAM_UNKNOWN = (
        "stream_unknown",
        _INPUT,
        "a stream name is not one of the known streams",
        "use a name from stepscope.Stream",
    )
    CADENCE_INVALID = (
        "cadence_invalid",
        _INPUT,
        "a cadence is not a positive integer or a step predicate",
    )
    SETTINGS_INVALID = ("settings_invalid", _INPUT, "a WatchSettings field has an invalid value")
    OPTIMIZER_UNSUPPORTED = (
        "optimizer_unsupported",
        _INPUT,
        "an optimizer is not a hookable torch optimizer nor wraps one",
    )
    # events
    EVENT_INVALID = ("event_invalid", _INPUT, "an observer event is missing a required field")
    CHECK_FAILED = ("check_failed", _STATE, "a check configured to raise found a violation")
    EXTRA_MISSING = (
        "extra_missing",
        _STATE,
        "an optional dependency is not installed",
        "install the stepscope extra named in the message",
    )
    EXPORT_DESTINATION_INVALID = (
        "export_destination_invalid",
        _INPUT,
        "an export destination is the wrong kind of path (a file where a folder goes, or back)",
        "pass --tensorboard a folder (new or existing) and --jsonl/--parquet a file/folder path",
    )
    EXPORT_EXISTS = (
        "export_exists",
        _STORAGE,
        "an export's run directory already holds events (re-export with overwrite)",
        "pass overwrite=True or export to another directory",
    )
    EXPORT_RUN_NAME_INVALID = (
        "export_run_name_invalid",
        _INPUT,
        "a run id cannot name an export run directory",
    )
    # profiling
    PROFILER_SESSION_NESTED = (
        "profiler_session_nested",
        _STATE,
        "a profiling session was opened inside another",
        "end the open profiling session before starting another",
    )
    PROFILER_SESSION_INACTIVE = (
        "profiler_session_inactive",
        _STATE,
        "an operation needs an active profiling session",
    )
    DEVICE_TIME_UNAVAILABLE = (
        "device_time_unavailable",
        _STATE,
        "no device events could be joined to ops",
    )
    TRACE_INVALID = (
        "trace_invalid",
        _INPUT,
        "a chrome trace file is unreadable or of an unknown shape",
    )
    SPAN_METADATA_INVALID = (
        "span_metadata_invalid",
        _INPUT,
        "region/span metadata is not a scalar (bool, int, float, str, None)",
    )
    PROFILE_VIEW_INVALID = (
        "profile_view_invalid",
        _INPUT,
        "a profile view was asked for an unknown key, column or count",
    )
    # probe
    PROBE_SPLIT_INVALID = (
        "probe_split_invalid",
        _INPUT,
        "probe indices fall outside the fitting training split",
    )
    PROBE_LAYER_UNSUPPORTED = (
        "probe_layer_unsupported",
        _INPUT,
        "a probe layer is not an affine layer it can measure",
    )
    PROBE_STATE_CHANGED = (
        "probe_state_changed",
        _STATE,
        "measuring would have changed model or optimizer state",
    )
    SNAPSHOT_MISSING = (
        "snapshot_missing",
        _STATE,
        "an update was requested without a predeclared snapshot",
    )
    PROBE_OUTPUT_INVALID = (
        "probe_output_invalid",
        _INPUT,
        "the probed model's output is not (n, classes) logits for the labels",
    )
    PROBE_DTYPE_UNSUPPORTED = (
        "probe_dtype_unsupported",
        _INPUT,
        "the probed model is not float32/float64; the probe never lowers precision",
    )
    PROBE_UPDATE_STEPS_INVALID = (
        "probe_update_steps_invalid",
        _STATE,
        "around_step saw zero or several optimizer steps, not exactly one",
    )
    PROBE_IDENTITY_CHANGED = (
        "probe_identity_changed",
        _STATE,
        "an artifact's probe differs (sha256, indices, dtype, ...) from the one it started with",
    )
    # curvature
    CURVATURE_MODEL_UNSUPPORTED = (
        "curvature_model_unsupported",
        _INPUT,
        "the model has no supported affine layer or output",
    )
    CURVATURE_INPUT_INVALID = (
        "curvature_input_invalid",
        _INPUT,
        "inputs/labels have the wrong shape or dtype",
    )
    CURVATURE_MODE_INVALID = (
        "curvature_mode_invalid",
        _INPUT,
        "an unknown curvature mode or family",
    )
    CURVATURE_NOT_CONVERGED = (
        "curvature_not_converged",
        _STATE,
        "an iterative method did not converge where convergence was required",
    )
    CURVATURE_WEIGHT_SHARED = (
        "curvature_weight_shared",
        _INPUT,
        "an analysed layer's parameter is used by several calls or modules (tied weights)",
    )
    CHECKPOINT_TAMPERED = (
        "checkpoint_tampered",
        _STORAGE,
        "a checkpoint, probe or source file does not match its sha256 pin",
    )
    CURVATURE_SOURCE_UNPINNED = (
        "curvature_source_unpinned",
        _INPUT,
        "the panel's model factory is defined in a file its pins do not name",
    )
    PANEL_OUTPUT_EXISTS = (
        "panel_output_exists",
        _STORAGE,
        "a curvature panel already ran into this output directory",
        "choose a new output directory",
    )
    # run log (user scalars, evaluation rows, clocks, branch activity)
    RUNLOG_NAME_INVALID = (
        "runlog_name_invalid",
        _INPUT,
        "a run-log name is empty, too long, malformed or in a reserved namespace",
    )
    RUNLOG_VALUE_INVALID = (
        "runlog_value_invalid",
        _INPUT,
        "a logged value is not one finite-or-nan real number",
    )
    RUNLOG_MASK_INVALID = (
        "runlog_mask_invalid",
        _INPUT,
        "a branch activity mask is empty or not boolean/real",
    )
    RUNLOG_STEP_INVALID = (
        "runlog_step_invalid",
        _INPUT,
        "a run-log row names a step that is negative or already written",
    )
    RUNLOG_CLOSED = (
        "runlog_closed",
        _STATE,
        "the run log was used after close()",
        "open a new run log",
    )
    # distributed / runs
    RUN_CONFIG_INVALID = ("run_config_invalid", _INPUT, "a demo or run configuration is invalid")
    # trainer integrations (Lightning, Hugging Face)
    INTEGRATION_STEP_MISMATCH = (
        "integration_step_mismatch",
        _STATE,
        "a trainer counts optimizer steps other than the recorded ones (recording stops)",
    )
    # report
    REPORT_INPUT_INVALID = (
        "report_input_invalid",
        _INPUT,
        "a report was given no runs, bad endpoints or an unreadable file",
    )
    OVERLAY_INVALID = (
        "overlay_invalid",
        _INPUT,
        "a historical overlay file is not the documented JSON shape",
    )


#: code -> one-line meaning (the string view of :class:`Code`, kept for existing readers).
CODES: dict[str, str] = {code.value: code.description for code in Code}


_BY_VALUE: dict[str, Code] = {c.value: c for c in Code}


def _lookup(code: object) -> Code:
    value = code.value if isinstance(code, Code) else code
    known = _BY_VALUE.get(value) if isinstance(value, str) else None
    if known is None:
        raise ValueError(f"unknown refusal code {code!r}; add it to stepscope.errors.Code")
    return known


class Refusal(Exception):
    """A refusal with a stable ``code``, a message and remedies.

    ``Refusal(code, ...)`` returns an instance of the code family's class
    (:class:`RefusalInputError`, :class:`RefusalStorageError` or ``Refusal`` itself), so
    ``except Refusal`` catches every refusal and ``except ValueError`` / ``except OSError`` catch
    their families.

    Parameters
    ----------
    code
        A :class:`Code` or its string value. Stable across releases; tests and users match on it.
    message
        What happened, in a sentence a user can act on.
    remedies
        What the user can do about it (each a short imperative sentence). When none are given,
        the code's default remedy (``Code.remedy``) is used if it has one.

    Attributes
    ----------
    code : str
        The code's string value (never the enum member), e.g. ``"history_disk_fault"``.

    Raises
    ------
    ValueError
        If ``code`` is not in the vocabulary (a bug in stepscope, not a user error).
    """

    code: str
    message: str
    remedies: tuple[str, ...]

    def __new__(cls, *args: Any, **kwargs: Any) -> Refusal:
        if cls is Refusal:  # a plain raise: pick the family's class (subclasses keep their own)
            code = args[0] if args else kwargs.get("code")
            cls = _FAMILY_CLASS[_lookup(code).family]
        return super().__new__(cls)  # the arguments are Refusal.__init__'s, not OSError's

    def __init__(self, code: str | Code, message: str, remedies: Iterable[str] = ()) -> None:
        known = _lookup(code)
        self.code = known.value
        self.message = message
        self.remedies = tuple(remedies)
        if not self.remedies and known.remedy is not None:
            self.remedies = (known.remedy,)
        text = f"[{self.code}] {message}"
        if self.remedies:
            text += " Remedies: " + "; ".join(self.remedies)
        super().__init__(text)
        self.args = (text,)  # OSError.__init__ leaves args alone for subclasses with __new__

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # keep picklable across processes (multiprocessing, DDP workers)
        return (type(self), (self.code, self.message, self.remedies))


class RefusalInputError(Refusal, ValueError):
    """A :class:`Refusal` of the :attr:`Family.INPUT` family; also a :class:`ValueError`."""


class RefusalStorageError(Refusal, OSError):
    """A :class:`Refusal` of the :attr:`Family.STORAGE` family; also an :class:`OSError`.

    ``errno`` is None and ``strerror`` is the message (no operating-system error number applies).
    """

    def __init__(self, code: str | Code, message: str, remedies: Iterable[str] = ()) -> None:
        super().__init__(code, message, remedies)
        self.strerror = message


_FAMILY_CLASS: dict[Family, type[Refusal]] = {
    Family.INPUT: RefusalInputError,
    Family.STORAGE: RefusalStorageError,
    Family.STATE: Refusal,
}


def require_extra(module: str, extra: str, purpose: str):
    """Import an optional dependency or refuse ``extra_missing`` naming the install command.

    Parameters
    ----------
    module
        The importable module name, e.g. ``"matplotlib.pyplot"``.
    extra
        The stepscope extra that provides it, e.g. ``"report"``.
    purpose
        What it is needed for (shown in the message).

    Returns
    -------
    module
        The imported module.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise Refusal(
            "extra_missing",
            f"{purpose} needs {top!r}, which is not installed ({exc}).",
            [f"pip install 'stepscope[{extra}]'", f"or: pip install {top}"],
        ) from exc

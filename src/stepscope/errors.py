"""One exception type, :class:`Refusal`, and the whole code vocabulary.

Every user-facing failure in stepscope raises :class:`Refusal` with a stable snake_case ``code``
(never renamed once released), a message that says what happened, and remedies that say what the
user can do. The vocabulary lives here, in one place; raising an unknown code is a programming
error that is itself caught by the test suite.

Example
-------
>>> from stepscope import Refusal
>>> try:
...     raise Refusal("selection_empty", "no module matched 'Conv*'", remedies=["check the names"])
... except Refusal as err:
...     err.code
'selection_empty'
"""

from __future__ import annotations

from collections.abc import Iterable

#: code -> one-line meaning. Grouped by area; codes from the seed documents are kept verbatim.
CODES: dict[str, str] = {
    # kernels
    "stat_dtype_unsupported": "the tensor dtype cannot be reduced (e.g. complex)",
    "sketch_descriptor_mismatch": "two histograms with different descriptors were merged",
    "descriptor_invalid": "a histogram descriptor has inconsistent or unsupported fields",
    "stat_payload_invalid": "a serialised statistic is malformed or inconsistent",
    "stat_kind_mismatch": "statistics of different kinds were combined",
    # selection / dataset mode
    "selection_empty": "a site selection matched nothing",
    "selection_invalid": "a site selection is of an unsupported form",
    "stat_unknown": "a statistic name is not known",
    # history artifact
    "history_artifact_corrupt": "a committed chunk or index row fails its checksum",
    "history_artifact_missing": "the path holds no stepscope artifact or a referenced file is absent",
    "history_json_invalid": "a manifest/catalog/index file is malformed or truncated",
    "history_chunk_name_invalid": "an index names a chunk outside the chunk directory",
    "history_schema_unsupported": "the artifact's schema version is not readable by this version",
    "history_writer_closed": "the writer was used after close()",
    "history_run_exists": "a new run was started on an existing run without resume",
    "history_series_unknown": "a site, stream or field that the artifact does not hold",
    "presence_payload_forbidden": "a non-observed presence carried a payload",
    "scale_grad_required": "a gradient-stream record lacks its scale_grad provenance",
    "ring_capacity_exhausted": "the RAM ring is full under the refuse policy",
    "merge_incompatible": "segments that cannot be merged (runs, steps or layouts differ)",
    "history_step_out_of_order": "a step block was written at or before an already written step",
    "history_writer_active": "another live writer holds the artifact's writer lock",
    "resume_fingerprint_mismatch": "a resumed run's model architecture differs from the artifact's",
    "resume_descriptor_mismatch": "a resumed run's histogram descriptor differs from the artifact's",
    "history_file_kind_invalid": "an artifact path is a link, directory, FIFO or device, not a regular file",
    "history_disk_fault": "a commit failed on a full or read-only disk; rows kept pending or disclosed",
    "history_index_incomplete": "the index accounts for fewer commits or evaluations than the artifact holds",
    "history_query_invalid": "a reader query has a malformed step range or micro-batch",
    # collector
    "step_transaction_required": "an operation needs the explicit step() transaction",
    "step_transaction_nested": "a step transaction was opened inside another",
    "collector_closed": "the collector was used after close()",
    "stream_unknown": "a stream name is not one of the known streams",
    "cadence_invalid": "a cadence is not a positive integer or a step predicate",
    "settings_invalid": "a WatchSettings field has an invalid value",
    "optimizer_unsupported": "an optimizer is not a hookable torch optimizer nor wraps one",
    # events
    "event_invalid": "an observer event is missing a required field",
    "check_failed": "a check configured to raise found a violation",
    "extra_missing": "an optional dependency is not installed",
    "export_exists": "an export's run directory already holds events (re-export with overwrite)",
    "export_run_name_invalid": "a run id cannot name an export run directory",
    # profiling
    "profiler_session_nested": "a profiling session was opened inside another",
    "profiler_session_inactive": "an operation needs an active profiling session",
    "device_time_unavailable": "no device events could be joined to ops",
    "trace_invalid": "a chrome trace file is unreadable or of an unknown shape",
    "span_metadata_invalid": "region/span metadata is not a scalar (bool, int, float, str, None)",
    "profile_view_invalid": "a profile view was asked for an unknown key, column or count",
    # probe
    "probe_split_invalid": "probe indices fall outside the fitting training split",
    "probe_layer_unsupported": "a probe layer is not an affine layer it can measure",
    "probe_state_changed": "measuring would have changed model or optimizer state",
    "snapshot_missing": "an update was requested without a predeclared snapshot",
    "probe_output_invalid": "the probed model's output is not (n, classes) logits for the labels",
    "probe_dtype_unsupported": "the probed model is not float32/float64; the probe never lowers precision",
    "probe_update_steps_invalid": "around_step saw zero or several optimizer steps, not exactly one",
    "probe_identity_changed": "an artifact's probe differs (sha256, indices, dtype, ...) from the one it started with",
    # curvature
    "curvature_model_unsupported": "the model has no supported affine layer or output",
    "curvature_input_invalid": "inputs/labels have the wrong shape or dtype",
    "curvature_mode_invalid": "an unknown curvature mode or family",
    "curvature_not_converged": "an iterative method did not converge where convergence was required",
    "curvature_weight_shared": "an analysed layer's parameter is used by several calls or modules (tied weights)",
    "checkpoint_tampered": "a checkpoint, probe or source file does not match its sha256 pin",
    "curvature_source_unpinned": "the panel's model factory is defined in a file its pins do not name",
    "panel_output_exists": "a curvature panel already ran into this output directory",
    "budget_censored": "a work budget would be exceeded; the run stopped with a censored result",
    # run log (user scalars, evaluation rows, clocks, branch activity)
    "runlog_name_invalid": "a run-log name is empty, too long, malformed or in a reserved namespace",
    "runlog_value_invalid": "a logged value is not one finite-or-nan real number",
    "runlog_mask_invalid": "a branch activity mask is empty or not boolean/real",
    "runlog_step_invalid": "a run-log row names a step that is negative or already written",
    "runlog_closed": "the run log was used after close()",
    # distributed / runs
    "distributed_unavailable": "torch.distributed is not initialised where it is required",
    "run_config_invalid": "a demo or run configuration is invalid",
    # trainer integrations (Lightning, Hugging Face)
    "integration_step_mismatch": "a trainer counts optimizer steps other than the recorded ones (recording stops)",
    # report
    "report_input_invalid": "a report was given no runs, bad endpoints or an unreadable file",
    "overlay_invalid": "a historical overlay file is not the documented JSON shape",
}


class Refusal(Exception):
    """A refusal with a stable ``code``, a message and remedies.

    Parameters
    ----------
    code
        A key of :data:`CODES`. Stable across releases; tests and users match on it.
    message
        What happened, in a sentence a user can act on.
    remedies
        What the user can do about it (each a short imperative sentence).

    Raises
    ------
    ValueError
        If ``code`` is not in the vocabulary (a bug in stepscope, not a user error).
    """

    def __init__(self, code: str, message: str, remedies: Iterable[str] = ()) -> None:
        if code not in CODES:
            raise ValueError(f"unknown refusal code {code!r}; add it to stepscope.errors.CODES")
        self.code = code
        self.message = message
        self.remedies: tuple[str, ...] = tuple(remedies)
        text = f"[{code}] {message}"
        if self.remedies:
            text += " Remedies: " + "; ".join(self.remedies)
        super().__init__(text)

    def __reduce__(self):  # keep picklable across processes (multiprocessing, DDP workers)
        return (type(self), (self.code, self.message, self.remedies))


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
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        raise Refusal(
            "extra_missing",
            f"{purpose} needs {top!r}, which is not installed ({exc}).",
            [f"pip install 'stepscope[{extra}]'", f"or: pip install {top}"],
        ) from exc

"""Resume: where a resumed collector's step and ``examples_seen`` continue from.

The checks themselves (same run, same model fingerprint, same histogram descriptor) are made by
the writer (:func:`stepscope.history.segment.check_resume_facts`), which also records the new
segment's own facts with its ancestry. This module answers the two questions the collector
has before its first step:

* which run the artifact holds (:func:`artifact_run_id`), so that a resume without an explicit
  ``run_id`` continues it;
* how many examples were consumed before the resume step (:func:`resumed_examples_seen`).

Example
-------
>>> from stepscope.history import StepBlockRecord
>>> resumed_examples_seen(10, StepBlockRecord(9, examples_seen=640), None)
640
>>> resumed_examples_seen(12, StepBlockRecord(9, examples_seen=640), None) is None  # a gap
True
>>> resumed_examples_seen(12, StepBlockRecord(9, examples_seen=640), 768)  # declared
768
"""

from __future__ import annotations

from pathlib import Path

from stepscope.history import StepBlockRecord
from stepscope.history.files import read_json

__all__ = ["artifact_run_id", "resumed_examples_seen"]


def artifact_run_id(path: str | Path) -> str | None:
    """The run id of the artifact in ``path`` (``None`` when there is none yet)."""
    manifest = Path(path) / "manifest.json"
    if not manifest.exists():
        return None
    segments = read_json(manifest, "manifest").get("segments") or [{}]
    run_id = segments[-1].get("run_id")
    return run_id if isinstance(run_id, str) else None


def resumed_examples_seen(
    step: int, before: StepBlockRecord | None, declared: int | None
) -> int | None:
    """``examples_seen`` at the resume ``step``: declared, or the committed block just before.

    Parameters
    ----------
    step
        The first step of the new segment.
    before
        The last committed step block before ``step`` (``None``: there is none).
    declared
        The user's ``resume_examples_seen`` (wins when given).

    Returns
    -------
    int or None
        ``0`` at step 0; the block's value when it is exactly ``step - 1``; otherwise ``None``
        (the steps in between were never committed, so the count is unknown, never restarted).
    """
    if declared is not None:
        return int(declared)
    if step == 0:
        return 0
    if before is None or before.optimizer_step != step - 1:
        return None
    return before.examples_seen

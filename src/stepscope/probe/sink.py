"""Writing probe records into the history artifact, and reading them back.

Every numeric field of a :class:`ProbeRecord` becomes a user scalar row named
``probe/<layer>/<key>`` (bias block: ``probe/<layer>/bias/<key>``; quantiles
``probe/<layer>/grad_norm_quantiles/<q>``; counts behind ratios ``probe/<layer>/validity/<key>``)
at ``optimizer_step``. The other two axes travel as rows ``probe/axes/examples_seen`` and
``probe/axes/epoch`` at the same step, so a probe series can be plotted against any of the three
clocks. The confusion matrix and predicted-class counts are integer rows
``probe/model/confusion/<true>/<predicted>`` and ``probe/model/predicted_counts/<class>``; above
the class cap (bounded confusion) only non-zero ``predicted_counts`` and ``per_class_errors/<class>``
rows and ``top_confused/<rank>/{true,predicted,count}``, never ``C x C`` rows.

A ``None`` value (absent, masked or undefined) writes **no row**: the reader's series simply has no
entry at that step, never a 0; the validity rows say why.

The probe's identity (sha256, indices, count, input normalisation, measurement dtype; see
:func:`probe_identity`) is persisted once per artifact as ``probe.json`` beside the manifest; a
later record with a different identity refuses ``probe_identity_changed``. Live subscribers: given
an :class:`~stepscope.events.EventBus` (or a collector, whose bus is used), the same rows are
published as ``scalar`` events (source ``probe``) and every undefined number as an
``unavailable`` event with its reason.

Example
-------
>>> import tempfile, torch
>>> import stepscope as ss
>>> from stepscope.history import HistoryWriter
>>> from stepscope.probe import DenseProbe
>>> model = torch.nn.Linear(3, 2)
>>> probe = DenseProbe(torch.randn(8, 3), torch.tensor([0, 1] * 4), size=4)
>>> path = tempfile.mkdtemp() + "/run"
>>> with HistoryWriter(path, durable=False) as w:
...     _ = write_probe_record(w, probe.measure(model, step=3, examples_seen=96, epoch=0))
>>> read_probe_axes(ss.open_run(path))["examples_seen"].tolist()
[96.0]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.events import Axes, EventSource, ScalarEvent, UnavailableEvent
from stepscope.history.files import atomic_write_json
from stepscope.probe.recorder import ProbeRecord

if TYPE_CHECKING:
    from stepscope.events.event import ObserverEvent

AXIS_ROWS = ("examples_seen", "epoch")
IDENTITY_FILE = "probe.json"
IDENTITY_SCHEMA = "stepscope.probe_identity.v1"
#: the identity fields a later measurement must repeat exactly
IDENTITY_KEYS = ("sha256", "indices", "size", "input_normalization", "dtype", "split_size")


def probe_scalar_rows(record: ProbeRecord) -> dict[str, float]:
    """``name -> value`` for every defined number of the record (``None`` values left out)."""
    rows = {k: v for k, v in record.scalars().items() if v is not None}
    rows["probe/axes/examples_seen"] = float(record.step.examples_seen)
    rows["probe/axes/epoch"] = float(record.step.epoch)
    rows["probe/model/n_examples"] = float(record.model.n_examples)
    bounded = record.model.confusion_mode == "bounded"
    for c, count in enumerate(record.model.predicted_counts):
        if count or not bounded:  # above the class cap: classes never predicted write no row
            rows[f"probe/model/predicted_counts/{c}"] = float(count)
    for c, count in enumerate(record.model.per_class_errors or ()):
        if count:
            rows[f"probe/model/per_class_errors/{c}"] = float(count)
    for rank, (true, pred, count) in enumerate(record.model.top_confused_pairs or ()):
        for key, value in (("true", true), ("predicted", pred), ("count", count)):
            rows[f"probe/model/top_confused/{rank}/{key}"] = float(value)
    for t, row in enumerate(record.model.confusion):
        for p, count in enumerate(row):
            rows[f"probe/model/confusion/{t}/{p}"] = float(count)
    return rows


def probe_identity(record: ProbeRecord) -> dict[str, Any]:
    """Which examples were probed and how: sha256, indices, count, normalisation, dtype, ..."""
    probe = dict(record.probe)
    return {"schema": IDENTITY_SCHEMA, **probe, "count": probe.get("size")}


def _persist_identity(directory: Path, record: ProbeRecord) -> dict[str, Any]:
    identity = probe_identity(record)
    path = directory / IDENTITY_FILE
    if path.exists():
        stored = json.loads(path.read_text())
        changed = [k for k in IDENTITY_KEYS if stored.get(k) != identity.get(k)]
        if changed:
            raise Refusal(
                "probe_identity_changed",
                f"this artifact's probe ({path}) differs in {changed}: a run must keep one probe",
                ["measure with the probe this run started with", "or write to a new artifact"],
            )
        return stored
    atomic_write_json(path, identity)
    return identity


def read_probe_identity(path: str | Path) -> dict[str, Any] | None:
    """The persisted probe identity of an artifact directory (``None`` if it never probed)."""
    file = Path(path) / IDENTITY_FILE
    return json.loads(file.read_text()) if file.exists() else None


def probe_events(record: ProbeRecord) -> list[ObserverEvent]:
    """The record as :class:`~stepscope.events.ObserverEvent` s (source ``probe``).

    Defined numbers become ``scalar`` events named like the rows; undefined ones (``None``)
    become ``unavailable`` events whose reason is ``undefined_or_absent`` (see the validity rows).
    """
    step = record.step
    axes = Axes(step.optimizer_step, step.examples_seen, step.epoch)
    probe = EventSource.PROBE
    out: list[ObserverEvent] = [
        ScalarEvent(n, axes, v, source=probe) for n, v in probe_scalar_rows(record).items()
    ]
    for name, value in record.scalars().items():
        if value is None:
            out.append(UnavailableEvent(name, axes, "undefined_or_absent", source=probe))
    return out


def write_probe_record(target: Any, record: ProbeRecord, bus: Any = None) -> int:
    """Append the record's rows at its step, persist its identity, publish it to subscribers.

    Parameters
    ----------
    target
        An :class:`~stepscope.history.HistoryWriter`, or a
        :class:`~stepscope.HistoryCollector` (its writer and its settings' event bus are used).
    record
        The measurement.
    bus
        An :class:`~stepscope.events.EventBus` to publish to (default: the collector's).

    Rows are committed with the writer's next commit (or ``close()``). Returns the row count.

    Raises
    ------
    Refusal
        ``probe_identity_changed`` when the artifact already holds a different probe.
    """
    writer, collector = target, None
    if hasattr(target, "settings") and hasattr(target, "writer"):  # a collector
        writer, collector = target.writer, target
        bus = bus if bus is not None else target.settings.event_bus
    rows = probe_scalar_rows(record)
    step = record.step.optimizer_step
    if writer is not None:
        _persist_identity(Path(writer.path), record)
        for name, value in rows.items():
            writer.write_scalar(name, step, value)
    elif collector is not None:  # a RAM-only collector keeps them as its user scalars
        for name, value in rows.items():
            collector.log(name, value, step=step)
    if bus is not None and bus.active:
        bus.publish(probe_events(record))
    return len(rows)


def read_probe_axes(reader: Any) -> dict[str, np.ndarray]:
    """The probe's steps and their ``examples_seen`` and ``epoch`` (from the axis rows)."""
    out: dict[str, np.ndarray] = {}
    for axis in AXIS_ROWS:
        series = reader.scalars(f"probe/axes/{axis}")
        out["optimizer_step"] = series.steps
        out[axis] = series.values
    return out


def read_probe_confusion(reader: Any, step: int) -> np.ndarray:
    """The ``(classes, classes)`` confusion matrix written at ``step`` (int64)."""
    names = [n for n in reader.scalar_names if n.startswith("probe/model/confusion/")]
    cells = {tuple(int(v) for v in n.rsplit("/", 2)[1:]): n for n in names}
    classes = 1 + max(max(k) for k in cells)
    out = np.zeros((classes, classes), dtype=np.int64)
    for (t, p), name in cells.items():
        series = reader.scalars(name)
        out[t, p] = int(series.values[series.steps == step][0])
    return out

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

Example
-------
>>> import tempfile, torch
>>> from stepscope.history import ArtifactWriter, open_history
>>> from stepscope.probe import DenseProbe
>>> model = torch.nn.Linear(3, 2)
>>> probe = DenseProbe(torch.randn(8, 3), torch.tensor([0, 1] * 4), size=4)
>>> path = tempfile.mkdtemp() + "/run"
>>> with ArtifactWriter(path, durable=False) as w:
...     _ = write_probe_record(w, probe.measure(model, step=3, examples_seen=96, epoch=0))
>>> read_probe_axes(open_history(path))["examples_seen"].tolist()
[96.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.probe.recorder import ProbeRecord

AXIS_ROWS = ("examples_seen", "epoch")


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


def write_probe_record(writer: Any, record: ProbeRecord) -> int:
    """Append the record's rows to an :class:`~stepscope.history.ArtifactWriter` at its step.

    Rows are committed with the writer's next commit (or ``close()``). Returns the row count.
    """
    rows = probe_scalar_rows(record)
    step = record.step.optimizer_step
    for name, value in rows.items():
        writer.write_scalar(name, step, value)
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

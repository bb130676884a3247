"""Confusion matrices of evaluation splits travel through ``log_eval`` (collector and RunLog)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stepscope import HistoryCollector, Refusal, WatchSettings, open_run
from stepscope.runlog.sink import read_eval_log


def _confusion(logits: torch.Tensor, y: torch.Tensor, classes: int) -> torch.Tensor:
    pred = logits.argmax(1)
    return torch.bincount(y * classes + pred, minlength=classes * classes).reshape(classes, classes)


def test_log_eval_confusion_is_stored_cell_by_cell(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    settings = WatchSettings(output_dir=str(tmp_path / "run"))
    with HistoryCollector(model, sites="*", streams=("activation",), settings=settings) as col:
        with torch.no_grad():
            logits = model(x)
        conf = _confusion(logits, y, 3)
        col.log_eval("validation", {"accuracy": 0.5, "confusion": conf}, sample_count=40)
    # independent: count (true, predicted) pairs with a Python loop
    pred = logits.argmax(1).tolist()
    expected = np.zeros((3, 3), dtype=np.int64)
    for t, p in zip(y.tolist(), pred):
        expected[t, p] += 1
    reader = open_run(tmp_path / "run")
    got = np.array(
        [
            [reader.scalars(f"eval/validation/confusion/{t}/{p}").values[0] for p in range(3)]
            for t in range(3)
        ]
    )
    np.testing.assert_array_equal(got, expected)
    counts = [reader.scalars(f"eval/validation/predicted_counts/{c}").values[0] for c in range(3)]
    assert counts == [pred.count(c) for c in range(3)]
    (rec,) = read_eval_log(reader)
    assert rec.metrics["confusion/2/2"] == expected[2, 2] and rec.metrics["accuracy"] == 0.5


def test_a_confusion_that_is_not_a_square_count_matrix_is_refused(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with HistoryCollector(model, sites="*", streams=("activation",)) as col:
        with pytest.raises(Refusal) as err:
            col.log_eval("validation", {"confusion": [[1.5, 0.0], [0.0, 1.0]]})
    assert err.value.code == "runlog_value_invalid"

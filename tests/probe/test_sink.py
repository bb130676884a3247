"""Probe rows round-trip through the history artifact (write, commit, reopen, compare)."""

from __future__ import annotations

import json
import math

import numpy as np
import torch

from stepscope import open_run
from stepscope.history import HistoryWriter
from stepscope.probe import DenseProbe
from stepscope.probe.sink import (
    probe_scalar_rows,
    read_probe_axes,
    read_probe_confusion,
    write_probe_record,
)
from tests.probe.probe_testkit import make_data, make_model


def test_probe_rows_round_trip_with_all_three_axes(tmp_path):
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=12)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    records = []
    with HistoryWriter(tmp_path / "run", durable=False, commit_steps=1) as writer:
        for step in range(3):
            active = {"3": step != 1}  # layer 3 skipped at step 1: None, no row
            rec = probe.measure(
                model, step=step, examples_seen=24 * step, epoch=step // 2, active=active
            )
            write_probe_record(writer, rec)
            records.append(rec)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    reader = open_run(tmp_path / "run")
    axes = read_probe_axes(reader)
    assert axes["optimizer_step"].tolist() == [0, 1, 2]
    assert axes["examples_seen"].tolist() == [0, 24, 48] and axes["epoch"].tolist() == [0, 0, 1]
    fisher = reader.scalars("probe/0/fisher_trace")
    assert fisher.values.tolist() == [r.layers["0"].fisher_trace for r in records]
    masked = reader.scalars("probe/3/fisher_trace")
    assert masked.steps.tolist() == [0, 2]  # the masked step has no row, not a 0
    assert reader.scalars("probe/3/validity/gradient_present").values.tolist() == [1.0, 0.0, 1.0]
    median = reader.scalars("probe/0/bias/grad_norm_quantiles/median")
    assert median.values[2] == records[2].layers["0"].bias.grad_norm_quantiles["median"]
    np.testing.assert_array_equal(read_probe_confusion(reader, 2), records[2].model.confusion)
    assert reader.scalars("probe/model/loss").values[1] == records[1].model.loss


def test_rows_and_dict_are_json_safe_and_carry_axes_and_legacy_names():
    model = make_model("cnn")
    x, y = make_data("cnn")
    rec = DenseProbe(x, y, size=6).measure(model, step=4, examples_seen=9, epoch=1)
    d = json.loads(json.dumps(rec.to_dict(), allow_nan=False))
    assert d["legacy_names"]["gradient_diversity"]["legacy_name"] == "layer-{i}/fisher/diversity"
    assert d["probe"]["sha256"] == rec.probe["sha256"] and d["probe"]["dtype"] == "float32"
    rows = rec.to_rows()
    json.dumps(rows, allow_nan=False)
    assert all(
        r["optimizer_step"] == 4 and r["examples_seen"] == 9 and r["epoch"] == 1 for r in rows
    )
    scalars = probe_scalar_rows(rec)
    assert all(math.isfinite(v) for v in scalars.values())
    assert rec.layers["2"]["fisher_trace"] == rec.layers["2"].fisher_trace
    assert "probe/2/bias/fisher_trace" not in scalars  # conv 2 has no bias: no row at all

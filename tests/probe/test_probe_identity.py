"""The probe's identity (sha256, indices, count, normalisation, dtype) is persisted in the artifact."""

from __future__ import annotations

import pytest
import torch

from stepscope import Refusal
from stepscope.history import HistoryWriter
from stepscope.probe import DenseProbe, probe_hash, read_probe_identity, write_probe_record
from tests.probe.probe_testkit import make_data, make_model


def test_identity_is_persisted_and_a_different_probe_is_refused(tmp_path):
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=12, seed=3, input_normalization="x / 255")
    with HistoryWriter(tmp_path / "run", durable=False) as w:
        write_probe_record(w, probe.measure(model, step=0, examples_seen=0, epoch=0))
        identity = read_probe_identity(tmp_path / "run")
        idx = torch.tensor(identity["indices"])
        # independent: hash the examples the stored indices name, straight from the split
        assert identity["sha256"] == probe_hash(x[idx], y[idx].to(torch.int64))
        assert identity["count"] == 12 and identity["input_normalization"] == "x / 255"
        assert identity["dtype"] == "float32" and identity["split_size"] == len(y)
        other = DenseProbe(x, y, size=12, seed=4)
        with pytest.raises(Refusal) as err:
            write_probe_record(w, other.measure(model, step=1, examples_seen=1, epoch=0))
        assert err.value.code == "probe_identity_changed"
        write_probe_record(w, probe.measure(model, step=2, examples_seen=2, epoch=0))  # same: ok
    assert read_probe_identity(tmp_path / "run") == identity

"""Probe selection: private RNG, split validation, hashing."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from stepscope import Refusal
from stepscope._purity import snapshot_rng
from stepscope.probe import DenseProbe, probe_hash, select_probe


def _split(n: int = 40):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3), generator=g).float(), torch.arange(n) % 4


def test_seeded_draw_is_deterministic_and_leaves_global_rng_untouched():
    x, y = _split()
    before = snapshot_rng()
    a = DenseProbe(x, y, size=10, seed=11).selection
    assert snapshot_rng().equals(before)
    b = DenseProbe(x, y, size=10, seed=11).selection
    c = DenseProbe(x, y, size=10, seed=12).selection
    assert a.indices == b.indices and a.sha256 == b.sha256
    assert a.indices != c.indices
    assert len(set(a.indices)) == 10 and all(0 <= i < 40 for i in a.indices)
    assert a.method == "seeded_randperm" and a.seed == 11 and a.split_size == 40


def test_default_size_is_128():
    x, y = _split(300)
    assert DenseProbe(x, y).selection.size == 128


def test_hash_is_sha256_of_raw_input_then_label_bytes():
    x, y = _split()
    sel, px, py = select_probe(x, y, indices=[5, 1, 9])
    assert sel.indices == (1, 5, 9)
    raw = x[[1, 5, 9]].numpy().tobytes() + y[[1, 5, 9]].to(torch.int64).numpy().tobytes()
    assert sel.sha256 == hashlib.sha256(raw).hexdigest() == probe_hash(px, py)
    y2 = y.clone()
    y2[5] = 3 - y2[5]
    assert select_probe(x, y2, indices=[1, 5, 9])[0].sha256 != sel.sha256


def test_normalization_and_input_range_are_recorded():
    x, y = _split()
    sel = DenseProbe(x, y, size=5, input_normalization="pixels 0..255, not normalised").selection
    d = sel.to_dict()
    assert d["input_normalization"] == "pixels 0..255, not normalised"
    assert 0 <= d["input_min"] <= d["input_max"] <= 255 and d["size"] == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"indices": [0, 40]},
        {"indices": [-1]},
        {"indices": [2, 2]},
        {"indices": []},
        {"indices": np.array([0.5])},
        {"size": 41},
        {"size": 0},
    ],
)
def test_indices_outside_the_split_refuse(kwargs):
    x, y = _split()
    with pytest.raises(Refusal) as err:
        DenseProbe(x, y, **kwargs)
    assert err.value.code == "probe_split_invalid" and err.value.remedies


def test_mismatched_inputs_and_labels_refuse():
    x, y = _split()
    with pytest.raises(Refusal) as err:
        DenseProbe(x, y[:-1])
    assert err.value.code == "probe_split_invalid"
    with pytest.raises(Refusal):
        DenseProbe(x, y.float())

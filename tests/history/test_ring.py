import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope import Refusal
from stepscope.history import (
    HistoryWriter,
    ObservationBatch,
    RingPolicy,
    StepBlockRecord,
    StepRing,
)
from stepscope.stats import Histogram


def _batch(hx, step, n_sites=2):
    return [
        ObservationBatch.observed(
            "activation", "forward", range(n_sites), hx.step_spines(step, n_sites)
        )
    ]


def test_refuse_raises_before_the_block_and_loses_nothing(hx):
    ring = StepRing(capacity=3)
    assert ring.policy is RingPolicy.REFUSE  # the default
    for step in range(3):
        ring.check_room()
        ring.push(StepBlockRecord(step), _batch(hx, step))
    held = ring.blocks()
    with pytest.raises(Refusal) as err:
        ring.check_room()
    assert err.value.code == "ring_capacity_exhausted" and len(err.value.remedies) >= 3
    with pytest.raises(Refusal) as err:
        ring.push(StepBlockRecord(3), _batch(hx, 3))
    assert err.value.code == "ring_capacity_exhausted"
    assert ring.blocks() == held and [b.step_lo for b in held] == [0, 1, 2]
    assert (ring.dropped_blocks, ring.coarsen_merges) == (0, 0)
    ring.clear()
    ring.push(StepBlockRecord(3), _batch(hx, 3))  # after the user reads/clears, it continues


def test_drop_oldest_keeps_the_newest_and_counts_what_it_dropped(hx):
    ring = StepRing(capacity=3, policy="drop_oldest")
    for step in range(10):
        ring.push(StepBlockRecord(step), _batch(hx, step))
    assert [(b.step_lo, b.step_hi) for b in ring.blocks()] == [(7, 7), (8, 8), (9, 9)]
    assert (ring.dropped_blocks, ring.dropped_steps, ring.coarsen_merges) == (7, 7, 0)
    np.testing.assert_array_equal(ring.blocks()[0].batches[0].spines, hx.step_spines(7, 2))


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(2, 6), n_steps=st.integers(1, 30), seed=st.integers(0, 1000))
def test_coarsen_preserves_every_count_and_spans_cover_all_steps(hx, capacity, n_steps, seed):
    rng = np.random.default_rng(seed)
    ring = StepRing(capacity=capacity, policy=RingPolicy.COARSEN)
    data = {}
    for step in range(n_steps):
        xs = [rng.normal(size=int(rng.integers(1, 6))) for _ in range(2)]
        if step % 3 == 0:
            xs[1][0] = np.nan
        data[step] = xs
        h = Histogram()
        h.update(torch.tensor(xs[0]))
        b = ObservationBatch.observed(
            "activation",
            "forward",
            [0, 1],
            np.stack([hx.np_spine(x) for x in xs]),
            hist_rows=[0],
            histograms=h.to_vector()[None],
        )
        ring.push(StepBlockRecord(step), [b])
    blocks = ring.blocks()
    assert len(blocks) == min(capacity, n_steps) and ring.dropped_blocks == 0
    spans = [(b.step_lo, b.step_hi) for b in blocks]
    assert spans[0][0] == 0 and spans[-1][1] == n_steps - 1
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))  # contiguous, no gaps
    assert sum(b.n_steps for b in blocks) == n_steps
    for b in blocks:
        (batch,) = b.batches
        for i in range(2):
            want = hx.np_spine(
                np.concatenate([data[t][i] for t in range(b.step_lo, b.step_hi + 1)])
            )
            np.testing.assert_array_equal(batch.spines[i, :7], want[:7])  # counts exact
            np.testing.assert_allclose(batch.spines[i, 7:], want[7:], rtol=1e-12, atol=1e-12)
        ref = Histogram()
        ref.update(
            torch.tensor(np.concatenate([data[t][0] for t in range(b.step_lo, b.step_hi + 1)]))
        )
        np.testing.assert_array_equal(batch.histograms[0], ref.to_vector())


def test_coarsening_makes_older_history_coarser(hx):
    ring = StepRing(capacity=3, policy="coarsen")
    for step in range(10):
        ring.push(StepBlockRecord(step), _batch(hx, step))
    assert [(b.step_lo, b.step_hi) for b in ring.blocks()] == [(0, 7), (8, 8), (9, 9)]


def test_disk_backed_ring_is_an_lru_cache(hx):
    ring = StepRing(capacity=2, disk_backed=True)
    ring.push(StepBlockRecord(0), _batch(hx, 0))
    ring.push(StepBlockRecord(1), _batch(hx, 1))
    assert ring.get(0).step_lo == 0  # touch 0: 1 becomes least recently used
    ring.push(StepBlockRecord(2), _batch(hx, 2))
    assert [b.step_lo for b in ring.blocks()] == [0, 2] and ring.evicted == 1
    assert ring.get(1) is None


def test_policies_are_explicit_and_never_switch(hx):
    with pytest.raises(Refusal) as err:
        StepRing(capacity=4, policy="drop_oldest", disk_backed=True)
    assert err.value.code == "settings_invalid"
    for bad in ({"capacity": 0}, {"policy": "shed"}, {"capacity": 1, "policy": "coarsen"}):
        with pytest.raises(Refusal):
            StepRing(**bad)
    ring = StepRing(capacity=2, policy="drop_oldest")
    for step in range(6):
        ring.push(StepBlockRecord(step), _batch(hx, step))
    assert all(b.n_steps == 1 for b in ring.blocks()) and ring.coarsen_merges == 0


def test_writer_keeps_recent_blocks_in_its_ring(run_dir, hx):
    ring = StepRing(capacity=4, disk_backed=True)
    w = HistoryWriter(run_dir, ring=ring, commit_steps=100)
    hx.write_simple_run(run_dir, n_steps=6, writer=w)
    assert [b.step_lo for b in ring.blocks()] == [2, 3, 4, 5]
    np.testing.assert_array_equal(ring.get(5).batches[0].spines, hx.step_spines(5, 3))

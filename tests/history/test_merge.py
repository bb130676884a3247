import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope import Refusal, open_run
from stepscope.history import (
    HistoryWriter,
    ObservationBatch,
    RunRecord,
    StepBlockRecord,
    fold_micro_batches,
    merge_batches,
    merge_ranks,
    merge_spine_rows,
)
from stepscope.history.merge import PARTIAL
from stepscope.stats import SPINE_FIELDS, Histogram, RunningStats

COUNTS = slice(0, 7)
EXTREMA = [SPINE_FIELDS.index(k) for k in ("min", "max", "absmax")]
FLOATS = [SPINE_FIELDS.index(k) for k in ("sum", "sum_squares", "sum_abs", "mean", "m2")]


def _data(rng, special=True):
    x = rng.normal(size=int(rng.integers(0, 9))) * 10.0 ** rng.integers(-3, 4)
    if special and x.size and rng.random() < 0.3:
        x[rng.integers(0, x.size)] = rng.choice([np.nan, np.inf, -np.inf, 0.0])
    return x


def _assert_spine_close(got, want):
    np.testing.assert_array_equal(got[COUNTS], want[COUNTS])  # counts exact
    np.testing.assert_array_equal(got[EXTREMA], want[EXTREMA])  # extrema exact
    np.testing.assert_allclose(got[FLOATS], want[FLOATS], rtol=1e-12, atol=1e-12)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_row_merge_equals_statistics_of_concatenated_data(seed, hx):
    rng = np.random.default_rng(seed)
    xs = [_data(rng) for _ in range(2)]
    merged = merge_spine_rows(hx.np_spine(xs[0])[None], hx.np_spine(xs[1])[None])[0]
    _assert_spine_close(merged, hx.np_spine(np.concatenate(xs)))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_row_merge_agrees_with_the_kernel_running_stats_merge(seed, hx):
    rng = np.random.default_rng(seed)
    a, b = (RunningStats.from_vector(hx.np_spine(_data(rng))) for _ in range(2))
    ours = merge_spine_rows(a.to_vector()[None], b.to_vector()[None])[0]
    np.testing.assert_allclose(ours, a.merge(b).to_vector(), rtol=1e-13, equal_nan=True)


def _rank_run(path, rank, world, data, n_steps, n_sites, np_spine):
    """Each rank observes its own data; site 1 is unscheduled on rank 0 at odd steps."""
    run = RunRecord.new(run_id="ddp", rank=rank, world_size=world)
    with HistoryWriter(path, run, commit_steps=3, durable=False) as w:
        ids = [w.register_site(f"l{i}", "torch.nn.Linear", "f32") for i in range(n_sites)]
        for t in range(n_steps):
            pres = np.ones(n_sites, np.uint8)
            spines = np.stack([np_spine(data[rank, t, i]) for i in ids])
            if rank == 0 and t % 2:
                pres[1] = 2
                spines[1] = np.nan
            hists = []
            for i in ids:
                h = Histogram()
                h.update(torch.tensor(data[rank, t, i]))
                hists.append(h.to_vector())
            b = ObservationBatch(
                "gradient",
                "backward",
                ids,
                pres,
                spines,
                hist_rows=[0],
                histograms=np.stack(hists[:1]),
                scale_grad="unscaled",
            )
            w.write_step(StepBlockRecord(t, examples_seen=4), [b], scalars={"loss": rank + t})


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rank_merge_equals_statistics_of_concatenated_rank_data(tmp_path, hx, world):
    rng = np.random.default_rng(world)
    n_steps, n_sites = 5, 3
    data = {
        (r, t, i): _data(rng) for r in range(world) for t in range(n_steps) for i in range(n_sites)
    }
    paths = []
    for rank in reversed(range(world)):  # order of arguments must not matter
        paths.append(tmp_path / f"rank{rank}")
        _rank_run(paths[-1], rank, world, data, n_steps, n_sites, hx.np_spine)
    out = merge_ranks(paths, tmp_path / "merged", durable=False)
    h = open_run(out)
    assert h.steps.tolist() == list(range(n_steps))
    assert [b.examples_seen for b in h.step_blocks()] == [4 * world] * n_steps
    assert [m["rank"] for m in h.run.extra["merged_ranks"]] == list(range(world))
    recs = {(r.step, r.site_id): r for r in h.observations()}
    for t in range(n_steps):
        for i in range(n_sites):
            ranks = [r for r in range(world) if not (r == 0 and t % 2 and i == 1)]
            want = hx.np_spine(np.concatenate([data[r, t, i] for r in ranks]))
            rec = recs[(t, i)]
            _assert_spine_close(rec.spine.to_vector(), want)
            assert (PARTIAL in rec.disclosures) == (len(ranks) < world)
            if i == 0:
                ref = Histogram()
                ref.update(torch.tensor(np.concatenate([data[r, t, 0] for r in range(world)])))
                assert rec.histogram == ref  # bin counts add exactly
            else:
                assert rec.histogram is None
    assert sorted(h.scalar_names) == sorted(f"rank{r}/loss" for r in range(world))


def test_rank_merge_refuses_mixed_runs_and_repeated_ranks(tmp_path, hx):
    a = tmp_path / "a"
    b = tmp_path / "b"
    hx.write_simple_run(a, run=RunRecord.new(run_id="one"))
    hx.write_simple_run(b, run=RunRecord.new(run_id="two"))
    for paths in ([a, b], [a, a]):
        with pytest.raises(Refusal) as err:
            merge_ranks(paths, tmp_path / "out")
        assert err.value.code == "merge_incompatible"


def test_micro_batch_fold_equals_the_whole_batch_statistics(hx):
    rng = np.random.default_rng(3)
    parts = [[_data(rng) for _ in range(3)] for _ in range(4)]  # 4 micro-batches x 3 sites
    batches = [
        ObservationBatch.observed(
            "activation",
            "forward",
            [0, 1, 2],
            np.stack([hx.np_spine(x) for x in part]),
            micro_batch=k,
        )
        for k, part in enumerate(parts)
    ]
    folded = fold_micro_batches(batches)
    assert folded.micro_batch is None
    for i in range(3):
        _assert_spine_close(folded.spines[i], hx.np_spine(np.concatenate([p[i] for p in parts])))


def test_merging_different_streams_or_scale_provenance_refuses(hx):
    s = hx.step_spines(0, 1)
    a = ObservationBatch.observed("gradient", "backward", [0], s, scale_grad="scaled")
    b = ObservationBatch.observed("gradient", "backward", [0], s, scale_grad="unscaled")
    c = ObservationBatch.observed("activation", "forward", [0], s)
    for other in (b, c):
        with pytest.raises(Refusal) as err:
            merge_batches(a, other)
        assert err.value.code == "merge_incompatible"


def test_merge_over_disjoint_sites_keeps_each_side(hx):
    a = ObservationBatch.observed("activation", "forward", [0, 2], hx.step_spines(0, 2))
    b = ObservationBatch.observed("activation", "forward", [1], hx.step_spines(1, 1))
    m = merge_batches(a, b)
    assert m.site_ids.tolist() == [0, 1, 2]
    np.testing.assert_array_equal(m.spines, np.stack([a.spines[0], b.spines[0], a.spines[1]]))
    assert all(PARTIAL in m.row_disclosure(i) for i in range(3))

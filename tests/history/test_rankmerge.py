"""Two real gloo ranks write their own artifacts concurrently; merge_ranks equals the pooled data."""

import multiprocessing
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist

from stepscope import open_run
from stepscope.history import (
    HistoryWriter,
    ObservationBatch,
    RunRecord,
    StepBlockRecord,
    merge_ranks,
)
from stepscope.stats import Histogram, reduce_spines

WORLD, STEPS, SITES = 2, 4, 3


def _data(rank, step, site):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + site)
    return torch.randn(5 + rank + site, generator=g) * (site + 1)


def _rank_main(root, rank):
    dist.init_process_group(
        "gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=WORLD
    )
    try:
        run = RunRecord.new(
            run_id="gloo-run", rank=dist.get_rank(), world_size=dist.get_world_size()
        )
        with HistoryWriter(root / f"rank{rank}", run, commit_steps=2, durable=False) as w:
            ids = [w.register_site(f"l{i}", "torch.nn.Linear", "f32") for i in range(SITES)]
            for step in range(STEPS):
                xs = [_data(rank, step, i) for i in range(SITES)]
                h = Histogram()
                h.update(xs[0])
                b = ObservationBatch.observed(
                    "activation",
                    "forward",
                    ids,
                    reduce_spines(xs).numpy(),
                    hist_rows=[0],
                    histograms=h.to_vector()[None],
                )
                w.write_step(StepBlockRecord(step, examples_seen=8), [b])
                dist.barrier()  # ranks advance in lockstep, as under DDP
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not hasattr(os, "fork"), reason="needs gloo+fork")
def test_gloo_ranks_merge_to_the_statistics_of_all_ranks_data(tmp_path, hx):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_main, args=(tmp_path, r)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * WORLD
    parts = [open_run(tmp_path / f"rank{r}") for r in range(WORLD)]
    assert [(h.run.rank, h.run.world_size) for h in parts] == [(0, 2), (1, 2)]

    merged = open_run(merge_ranks([tmp_path / "rank0", tmp_path / "rank1"], tmp_path / "m"))
    recs = {(r.step, r.site_id): r for r in merged.observations()}
    for step in range(STEPS):
        for i in range(SITES):
            pooled = torch.cat([_data(r, step, i) for r in range(WORLD)]).double().numpy()
            want = hx.np_spine(pooled)
            got = recs[(step, i)].spine.to_vector()
            np.testing.assert_array_equal(got[:7], want[:7])
            np.testing.assert_allclose(got[7:], want[7:], rtol=1e-12, atol=1e-12)
        ref = Histogram()
        ref.update(torch.cat([_data(r, step, 0) for r in range(WORLD)]))
        assert recs[(step, 0)].histogram == ref
    assert [b.examples_seen for b in merged.step_blocks()] == [16] * STEPS

"""Real two-process DistributedDataParallel training on gloo (CPU): each rank writes its own
segment, ``stepscope merge`` combines them, and the merged counts and histograms equal the
per-rank sums and a single histogram over every rank's tensors (rebuilt from dumped tensors)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from stepscope import open_run
from stepscope.cli import main
from stepscope.stats import SPINE_FIELDS, Histogram

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
STEPS, WORLD = 3, 2
COUNTS = ("total", "finite", "zero", "negative", "nan", "posinf", "neginf")


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(EXAMPLE), "--out", str(root / "run"), "--world-size", str(WORLD)]
    cmd += ["--steps", str(STEPS), "--dump", str(root / "dump")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [root / "run" / f"rank{r:03d}" for r in range(WORLD)]
    merged = root / "merged"
    assert main(["merge", *map(str, ranks), "--out", str(merged)]) == 0
    return {"ranks": ranks, "merged": merged, "dump": root / "dump"}


def dumped(dump: Path, kind: str, rank: int, step: int) -> torch.Tensor:
    return torch.from_numpy(np.load(dump / f"{kind}_r{rank}_s{step}.npy", allow_pickle=False))


def test_each_rank_wrote_its_own_segment_with_rank_and_world(ddp_run):
    readers = [open_run(p) for p in ddp_run["ranks"]]
    assert [h.run.rank for h in readers] == list(range(WORLD))
    assert {h.run.world_size for h in readers} == {WORLD}
    assert len({h.run.run_id for h in readers}) == 1
    assert len({h.run.segment_id for h in readers}) == WORLD
    for h in readers:
        assert h.steps.tolist() == list(range(STEPS))
        assert h.verify().ok


def test_merged_counts_equal_the_per_rank_sums(ddp_run):
    readers = [open_run(p) for p in ddp_run["ranks"]]
    merged = open_run(ddp_run["merged"])
    assert merged.steps.tolist() == list(range(STEPS))
    blocks = merged.step_blocks()
    assert [b.examples_seen for b in blocks] == [32 * WORLD * (s + 1) for s in range(STEPS)]
    checked = 0
    for site in ("0", "1", "2"):
        for field in COUNTS:
            got = merged.series(site, "activation", field).values
            want = sum(h.series(site, "activation", field).values for h in readers)
            np.testing.assert_array_equal(got, want)
            checked += 1
        got = merged.histograms(site, "activation").counts
        want = sum(h.histograms(site, "activation").counts for h in readers)
        np.testing.assert_array_equal(got, want)
    for site in ("0.weight", "2.bias"):
        for stream in ("gradient", "parameter"):
            got = merged.series(site, stream, "total").values
            want = sum(h.series(site, stream, "total").values for h in readers)
            np.testing.assert_array_equal(got, want)
    assert checked == 3 * len(COUNTS)


def test_merged_histograms_equal_one_histogram_over_every_ranks_tensors(ddp_run):
    merged = open_run(ddp_run["merged"])
    dump = ddp_run["dump"]
    acts = merged.histograms("0", "activation")
    grads = merged.histograms("0.weight", "gradient")
    assert acts.steps.tolist() == grads.steps.tolist() == list(range(STEPS))
    for i, step in enumerate(range(STEPS)):
        seen = [dumped(dump, "act", r, step) for r in range(WORLD)]
        assert not torch.equal(seen[0], seen[1])  # each rank saw its own shard
        reference = Histogram()
        reference.update(torch.cat([t.reshape(-1) for t in seen]))
        assert acts.histogram(i) == reference
        spine = {f: merged.series("0", "activation", f).values[i] for f in SPINE_FIELDS}
        allv = torch.cat([t.reshape(-1) for t in seen]).double()
        assert spine["total"] == allv.numel() == WORLD * 32 * 16
        assert spine["zero"] == int((allv == 0).sum())
        np.testing.assert_allclose(spine["sum_squares"], float(allv.pow(2).sum()), rtol=1e-6)
        np.testing.assert_allclose(spine["mean"], float(allv.mean()), rtol=1e-6, atol=1e-9)
        assert spine["max"] == float(allv.max())
        # DDP averaged the gradients: every rank held the same tensor, counted once per rank
        g = [dumped(dump, "grad", r, step) for r in range(WORLD)]
        assert torch.equal(g[0], g[1])
        reference = Histogram()
        reference.update(torch.cat([t.reshape(-1) for t in g]))
        assert grads.histogram(i) == reference

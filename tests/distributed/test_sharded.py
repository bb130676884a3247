"""FSDP2 (``fully_shard`` per layer) and DDP on real gloo process groups (2 and 4 CPU processes):
merged parameter, gradient and update statistics equal those of the same model trained unsharded
in one process on the concatenated batch; the live merge that rank 0 publishes equals
``stepscope merge`` of the rank segments; the update sample is the same for world sizes 1, 2, 4.

The model is ``examples/fsdp_train.py``'s: a transformer encoder layer plus a head, float64,
5 steps, every stream every step (spine and histogram). The single-process reference runs in this
process; each distributed run spawns its ranks in a child interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from stepscope import open_run
from stepscope.cli import main
from stepscope.history import Presence
from stepscope.history.batch import code_of
from stepscope.stats import SPINE_FIELDS

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdp_train.py"
STEPS = 5
# across two runs whose float reductions differ in order: ``zero``/``negative`` are left out (the
# attention key-bias gradient is 0 mathematically; rounding decides whether it is exactly 0)
COUNTS = [SPINE_FIELDS.index(f) for f in ("total", "finite", "nan", "posinf", "neginf")]
# within one run, against the full logical tensor: every count, bit for bit
ALL_COUNTS = [SPINE_FIELDS.index(f) for f in SPINE_FIELDS[:7]]
EXTREMES = [SPINE_FIELDS.index(f) for f in ("min", "max", "absmax")]
PARAM_STREAMS = ("gradient", "parameter", "update")
OBSERVED = code_of(Presence.OBSERVED)


def _example():
    spec = importlib.util.spec_from_file_location("fsdp_train", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spines(history, site: str, stream: str) -> np.ndarray:
    """``[steps, SPINE_WIDTH]`` of one site and stream, read back from an artifact."""
    cols = [history.series(site, stream, f).values for f in SPINE_FIELDS]
    return np.stack(cols, axis=1)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The unsharded model, one process, the whole batch (world size 1)."""
    root = tmp_path_factory.mktemp("single")
    ex = _example()
    facts = ex.train(0, 1, "single", str(root / "run"), "single", STEPS, str(root / "dump"))
    return {"history": open_run(root / "run"), "facts": facts}


_RUNS: dict[tuple[str, int], dict] = {}


def distributed_run(tmp_path_factory: pytest.TempPathFactory, mode: str, world: int) -> dict:
    """Spawn ``world`` gloo ranks once per (mode, world); merge their segments offline."""
    key = (mode, world)
    if key not in _RUNS:
        root = tmp_path_factory.mktemp(f"{mode}{world}")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, str(EXAMPLE), "--mode", mode, "--world-size", str(world)]
        cmd += ["--steps", str(STEPS), "--out", str(root / "run"), "--dump", str(root / "dump")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        ranks = [root / "run" / f"rank{r:03d}" for r in range(world)]
        assert main(["merge", *map(str, ranks), "--out", str(root / "merged")]) == 0
        facts = [json.loads((root / "dump" / f"rank{r}.json").read_text()) for r in range(world)]
        _RUNS[key] = {
            "merged": open_run(root / "merged"),
            "ranks": [open_run(p) for p in ranks],
            "facts": facts,
        }
    return _RUNS[key]


CASES = [
    pytest.param("fsdp", 2, id="fsdp2-world2"),
    pytest.param("fsdp", 4, id="fsdp2-world4", marks=pytest.mark.slow),
    pytest.param("ddp", 2, id="ddp-world2"),
    pytest.param("ddp", 4, id="ddp-world4", marks=pytest.mark.slow),
]


def param_sites(facts: dict) -> list[str]:
    """Names of the model's parameters (``named_parameters`` of the reference run)."""
    return sorted(k.split("/", 1)[1] for k in facts["full"][0] if k.startswith("parameter/"))


def assert_same_statistics(got: np.ndarray, want: np.ndarray, scale: float = 1.0) -> None:
    """Counts exact (``scale`` times the reference's), extremes and moments to 1e-12 relative.

    ``sum`` and ``mean`` may cancel to ~0 (a softmax head's bias gradient sums to zero), so
    they are held to 1e-12 relative to ``sum_abs`` and ``absmax``, their natural scales.
    """
    f = SPINE_FIELDS.index
    np.testing.assert_array_equal(got[:, COUNTS], scale * want[:, COUNTS])
    np.testing.assert_allclose(got[:, EXTREMES], want[:, EXTREMES], rtol=1e-12, atol=0)
    m = [f("sum_squares"), f("sum_abs"), f("m2")]
    np.testing.assert_allclose(got[:, m], scale * want[:, m], rtol=1e-12, atol=0)
    for name, by in (("sum", "sum_abs"), ("mean", "absmax")):
        err = np.abs(got[:, f(name)] - (scale if name == "sum" else 1.0) * want[:, f(name)])
        assert (err <= 1e-12 * want[:, f(by)] * (scale if name == "sum" else 1.0)).all(), name


@pytest.mark.parametrize(("mode", "world"), CASES)
def test_merged_parameter_statistics_equal_the_unsharded_run(
    tmp_path_factory, reference, mode, world
):
    run = distributed_run(tmp_path_factory, mode, world)
    ref = reference["history"]
    sites = param_sites(reference["facts"])
    assert "0.self_attn.in_proj_weight" in sites and len(sites) == 14
    for site in sites:
        for stream in PARAM_STREAMS:
            want = spines(ref, site, stream)
            got = spines(run["merged"], site, stream)
            assert got.shape == want.shape == (STEPS, len(SPINE_FIELDS))
            if mode == "fsdp":  # every logical element counted once, on the rank that owns it
                assert_same_statistics(got, want)
                per_rank = [spines(h, site, stream)[:, 0] for h in run["ranks"]]
                np.testing.assert_array_equal(sum(per_rank), want[:, 0])
                if stream != "update" and want[0, 0] > 3:  # really split (dim 0 >= 2 rows)
                    assert sum(t[0] > 0 for t in per_rank) >= 2
            else:  # DDP replicates: every rank holds (and records) the whole parameter
                for h in run["ranks"]:
                    assert_same_statistics(spines(h, site, stream), want)
                assert_same_statistics(got, want, scale=world)
    # activations stay per rank (each its slice of the batch) and merge to the whole batch
    for site in ("0.linear1", "0.norm2", "2"):
        assert_same_statistics(
            spines(run["merged"], site, "activation"), spines(ref, site, "activation")
        )


@pytest.mark.parametrize(("mode", "world"), [c for c in CASES if c.values[0] == "fsdp"])
def test_merged_shards_equal_the_full_logical_tensor_exactly(tmp_path_factory, mode, world):
    """Against ``DTensor.full_tensor()`` of the same run: counts and extremes bit for bit."""
    run = distributed_run(tmp_path_factory, mode, world)
    live, full = run["facts"][0]["live"], run["facts"][0]["full"]
    assert sorted(map(int, full)) == list(range(STEPS))
    for step, rows in full.items():
        for key, want in rows.items():
            presence, got = live[step][key]
            assert presence == OBSERVED
            got, want = np.array(got), np.array(want)
            np.testing.assert_array_equal(got[ALL_COUNTS + EXTREMES], want[ALL_COUNTS + EXTREMES])
            assert_same_statistics(got[None], want[None])


@pytest.mark.parametrize(("mode", "world"), CASES)
def test_live_merged_rows_equal_the_offline_merge(tmp_path_factory, mode, world):
    run = distributed_run(tmp_path_factory, mode, world)
    live = run["facts"][0]["live"]
    assert sorted(map(int, live)) == list(range(STEPS))
    assert all(not f["live"] for f in run["facts"][1:])  # only rank 0 holds merged rows
    merged, checked = run["merged"], 0
    for key in live["0"]:
        stream, site = key.split("/", 1)
        offline = spines(merged, site, stream)
        for step in range(STEPS):
            _presence, row = live[str(step)][key]
            np.testing.assert_array_equal(np.array(row, dtype=float), offline[step])
            checked += 1
    assert checked >= STEPS * 40


@pytest.mark.parametrize(("mode", "world"), [c for c in CASES if c.values[0] == "fsdp"])
def test_update_sample_is_the_same_logical_indices_for_world_sizes_1_2_4(
    tmp_path_factory, reference, mode, world
):
    run = distributed_run(tmp_path_factory, mode, world)
    want = reference["facts"]["owned"]
    sampled = [s for s, idx in want.items() if len(idx) == 64]
    assert len(sampled) == 5  # the sample really is a subset for the large parameters
    for site, indices in want.items():
        owned = [f["owned"][site] for f in run["facts"]]
        union = sorted(i for part in owned for i in part)
        assert union == sorted(indices), site
        assert len(set(union)) == len(union)  # the shards own disjoint indices


@pytest.mark.parametrize(("mode", "world"), CASES[:1])
def test_one_collective_per_logged_step_and_its_bytes_are_in_the_plan(
    tmp_path_factory, mode, world
):
    run = distributed_run(tmp_path_factory, mode, world)
    for f in run["facts"]:
        assert f["collectives"] == STEPS  # not one per site: ~80 rows are logged per step
        assert f["bytes_sent"] == STEPS * f["bytes_per_step"]  # histogram every step here
        assert "live merge: 1 gather per logged step" in f["plan"]


@pytest.mark.parametrize(("mode", "world"), CASES[:1])
def test_rank0_publishes_the_merged_rows_and_other_ranks_their_own(tmp_path_factory, mode, world):
    """The event bus's ``l2`` of each parameter: the whole logical parameter's on rank 0
    (from the offline merge), the rank's own shard's elsewhere (from its segment)."""
    run = distributed_run(tmp_path_factory, mode, world)
    col = SPINE_FIELDS.index("sum_squares")
    for rank, facts in enumerate(run["facts"]):
        source = run["merged"] if rank == 0 else run["ranks"][rank]
        events = facts["l2_events"]
        assert len(events) == STEPS * 14
        for key, value in events.items():
            step, name = key.split(":", 1)
            site = name.split("/")[1]
            want = np.sqrt(spines(source, site, "parameter")[int(step), col])
            assert value == want, (rank, key)

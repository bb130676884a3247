"""The step boundary's fast paths write exactly what the plain path writes.

The boundary caches per-stream row plans, builds its batches without re-validating what it
constructed itself, skips host work on steps where nothing is due, and reuses step facts that
did not change (in :mod:`stepscope.collect.write`; only that
path ships, and :func:`_plain` below switches it off for the reference). Each test records the same
25-step run of a real model twice, once as shipped and once with every fast path off and the
batches assembled by the previous per-row implementation
(:func:`tests.collect.boundary_reference.reference_assemble_batches`), then reads both artifacts
back with the history reader and compares every stored value: every step block (all but its
wall-clock time), every observation row (site, stream, phase, presence, scale, disclosure,
spine bits), every histogram row, every scalar (the ``clock/*`` timings by name and step only,
their values are wall-clock), and the catalog of sites, scalar names and disclosure sets.

The runs cover a GPT-like decoder with variable sequence length (a dropout that never runs:
``site_absent``) and a CNN with BatchNorm, each at the default cadence and at ``Cadence(1, 2)``,
with user scalars, a branch mask that withholds a block's gradients, and rows whose reduction
failed (``capture_failed``) or was refused (``unsupported``) on some steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import stepscope.collect.surgery as surgery_mod
import stepscope.collect.write as write_mod
from stepscope import open_run
from stepscope.collect import Cadence, HistoryCollector, WatchSettings
from stepscope.collect.staging import Reducer
from stepscope.history.artifact import HistoryWriter
from stepscope.history.layout import TABLES
from tests.collect.boundary_reference import reference_assemble_batches
from tests.collect.models import LENGTHS, ResNetish, TinyGPT

STEPS = 25
INJECT_AT = (4, 10, 20)  # steps on which some rows fail or are refused (due by both cadences)
MASKED_AT = (10, 12)  # steps on which a branch mask says a block did not run


def _gpt_batch(g: torch.Generator, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = LENGTHS[step % len(LENGTHS)]
    return torch.randint(0, 40, (3, t), generator=g), torch.randint(0, 40, (3, t), generator=g)


def _cnn_batch(g: torch.Generator, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)


MODELS = {
    "gpt": (TinyGPT, _gpt_batch, "h.1", ("h.0.mlp.0", "h.1.ln_1"), "h.0.attn.qkv.weight"),
    "cnn": (ResNetish, _cnn_batch, "layer1", ("layer1.bn1", "fc"), "layer2.conv1.weight"),
}
#: model surgery: this Linear is replaced by a fresh one before step SURGERY_AT (new series)
REPLACED = {"gpt": ("h.1.mlp", "0"), "cnn": ("", "fc")}
SURGERY_AT = 12


def _inject(monkeypatch: pytest.MonkeyPatch, model_name: str) -> None:
    """On :data:`INJECT_AT` steps one activation row fails, one is refused (``unsupported``)
    and one gradient row fails, the way a raising or refusing reduction records them."""
    _, _, _, (failing, refused), grad_site = MODELS[model_name]
    real_reduce, real_many, real_direct = Reducer.reduce, Reducer.reduce_many, Reducer.direct

    def reduce(self, row, tensor):
        state = self.recording()
        if state is not None and state.step in INJECT_AT and state.spine_due[row.stream]:
            if row.site == failing and row.stream == "activation":
                real_reduce(self, row, tensor)  # written, then raised: the row is dropped
                state.failed[row.index] = "RuntimeError"
                return
            if row.site == refused and row.stream == "activation":
                state.unsupported[row.index] = "injected"
                return
        real_reduce(self, row, tensor)

    def reduce_many(self, stream, pairs):
        state = self.recording()
        if state is not None and state.step in INJECT_AT and stream == "gradient":
            real_many(self, stream, pairs)  # written, then raised: the row is dropped
            for row, _ in pairs:
                if row.site == grad_site:
                    state.failed[row.index] = "ValueError"
            return
        real_many(self, stream, pairs)

    def direct(self, entry, tensor, state):
        if state.step in INJECT_AT and entry[0].site in (failing, refused):
            return False  # through reduce(), where the fault is injected
        return real_direct(self, entry, tensor, state)

    monkeypatch.setattr(Reducer, "reduce", reduce)
    monkeypatch.setattr(Reducer, "reduce_many", reduce_many)
    monkeypatch.setattr(Reducer, "direct", direct)


def _record(model_name: str, cadence: Cadence | None, path: str | None) -> HistoryCollector:
    build, batch, branch, _, _ = MODELS[model_name]
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    c = HistoryCollector(
        model,
        cadence=cadence,
        settings=WatchSettings(
            output_dir=path, update_sample_size=64, commit_steps=5, commit_seconds=1e9
        ),  # commits by count, never by the wall clock: both runs commit at the same steps
    )
    for step in range(STEPS):
        if step == SURGERY_AT:
            parent_name, child = REPLACED[model_name]
            parent = model.get_submodule(parent_name)
            old = getattr(parent, child)
            torch.manual_seed(step)
            setattr(parent, child, torch.nn.Linear(old.in_features, old.out_features))
        with c.step(opt, examples=3 + step % 2) as txn:
            x, y = batch(g, step)
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            txn.log("loss", loss.detach())
            txn.log("lr", 1e-2)
            if step in MASKED_AT:
                c.log_mask(branch, torch.zeros(4, dtype=torch.bool))
    c.close()
    return c


def _stored(path: str) -> dict:
    """Every value the artifact stores, with wall-clock values blanked."""
    h = open_run(path)
    out: dict = {
        "sites": [s.to_dict() for s in h.sites],
        "scalar_names": list(h.scalar_names),
        "disclosures": [tuple(d) for d in h.disclosures],
        "blocks": [b.to_dict() | {"wall_time": None} for b in h.step_blocks()],
    }
    for table in TABLES:
        rows = h.table(table).copy()
        if table == "steps":
            rows["wall_time"] = 0.0
        if table == "scalars":
            clock = [i for i, n in enumerate(h.scalar_names) if n.startswith("clock/")]
            rows["value"][np.isin(rows["name"], clock)] = 0.0
        out[table] = rows
    return out


def _plain(m: pytest.MonkeyPatch) -> None:
    """Every fast path of the step boundary off: the reference the shipped path is compared to.

    Batches assembled row by row (:func:`reference_assemble_batches`) and checked by the writer
    like any other producer's, the step facts built afresh every step, and model surgery
    searched for on every checked step (no identity shortcut).
    """
    m.setattr(write_mod, "assemble_batches", reference_assemble_batches)
    truth = write_mod.step_truth
    m.setattr(write_mod, "step_truth", lambda s, sc, p, k, seen=None: truth(s, sc, p, k, None))
    write_step = HistoryWriter.write_step

    def checked(self, block, batches=(), observations=(), scalars=None, *, trusted=False):
        return write_step(self, block, batches, observations, scalars, trusted=False)

    m.setattr(HistoryWriter, "write_step", checked)
    m.setattr(surgery_mod, "identity_edges", lambda *a: [({}, "never bound", object())])


def _assert_same(fast: dict, plain: dict) -> None:
    for key in ("sites", "scalar_names", "disclosures", "blocks"):
        assert fast[key] == plain[key], key
    for table in TABLES:
        a, b = fast[table], plain[table]
        assert a.dtype == b.dtype and a.shape == b.shape, table
        assert a.tobytes() == b.tobytes(), table  # bit for bit, NaN rows included


def _presences(stored: dict) -> set[int]:
    return set(stored["observations"]["presence"].tolist())


@pytest.mark.parametrize("cadence", [None, Cadence(1, 2)], ids=["default", "every_step"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_fast_boundary_stores_exactly_what_the_plain_boundary_stores(
    model_name, cadence, tmp_path, monkeypatch
):
    _inject(monkeypatch, model_name)
    _record(model_name, cadence, str(tmp_path / "fast"))
    with monkeypatch.context() as m:
        _plain(m)
        _record(model_name, cadence, str(tmp_path / "plain"))
    fast, plain = _stored(str(tmp_path / "fast")), _stored(str(tmp_path / "plain"))
    _assert_same(fast, plain)
    # the run exercised what it claims: histograms, every presence, row disclosures, masks
    assert len(fast["histograms"]) > 0 and len(fast["blocks"]) == STEPS
    codes = {write_mod.OBSERVED, write_mod.FAILED, write_mod.UNSUPPORTED}
    assert codes <= _presences(fast)
    notes = {d for ds in fast["disclosures"] for d in ds}
    assert {"capture_failed:RuntimeError", "capture_failed:ValueError"} <= notes
    assert "unsupported:injected" in notes
    assert any(n.startswith("update_sampled:") for n in notes)
    assert any(n.startswith("branch_not_run:") for n in notes)
    ended = {s["ended_reason"] for s in fast["sites"]}
    assert "module_replaced" in ended  # the surgery started new series mid-run
    if model_name == "gpt":  # its attention dropout never runs
        assert write_mod.ABSENT in _presences(fast)


def test_the_plain_boundary_is_a_different_code_path(tmp_path, monkeypatch):
    """The comparison above can fail: the reference path is really taken when switched off."""
    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return reference_assemble_batches(*args, **kwargs)

    _plain(monkeypatch)
    monkeypatch.setattr(write_mod, "assemble_batches", spy)
    _record("gpt", Cadence(5, 0), str(tmp_path / "run"))
    assert len(calls) == len(range(0, STEPS, 5))  # every step with a stream due


def _ring(c: HistoryCollector) -> list:
    """Every batch the RAM ring holds, field by field (arrays as dtype, shape and bytes)."""

    def plain(v):
        if isinstance(v, np.ndarray):
            return (v.dtype.str, v.shape, v.tobytes())
        return v

    out = []
    for rb in c.ring.blocks():
        out.append(rb.block.to_dict() | {"wall_time": None})
        for b in rb.batches:
            out.append({k: plain(v) for k, v in b.__dict__.items()})
    return out


@pytest.mark.parametrize("cadence", [None, Cadence(1, 2)], ids=["default", "every_step"])
def test_fast_boundary_keeps_the_same_ram_ring(cadence, monkeypatch):
    """Without an output directory the steps live in the RAM ring: the same batches there."""
    _inject(monkeypatch, "gpt")
    fast = _ring(_record("gpt", cadence, None))
    with monkeypatch.context() as m:
        _plain(m)
        plain = _ring(_record("gpt", cadence, None))
    assert len(fast) > STEPS and fast == plain

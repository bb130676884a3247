"""Forward modes inside a training forward, and the implicit spelling's missing ``scaler=``.

* A teacher forward under ``torch.inference_mode()`` / ``torch.no_grad()`` *inside* the training
  forward counts, as docs/sites.md says (the mode is read where the model is called): its
  activation rows equal the teacher's outputs, reduced independently in float64.
* A module called under ``torch.func.vmap`` is disclosed for that call (``unsupported:torch_func``
  or ``skipped_calls:torch_func``), never ``capture_failed`` for the whole row, and the step's
  other calls are recorded.
* The implicit spelling with a GradScaler that skips a step, but no ``scaler=``, warns once,
  naming ``scaler=``.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import stepscope as ss
from tests.collect.stepkit import disk_settings


class Distilled(nn.Module):
    def __init__(self, mode) -> None:
        super().__init__()
        self.mode = mode
        self.teacher = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        self.student = nn.Linear(6, 3)
        self.seen: list[torch.Tensor] = []  # the teacher's outputs, for the oracle

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.mode():
            t = self.teacher(x)
        self.seen.append(t.clone().double())
        return self.student(x) - t


def _observations(run, stream="activation"):
    reader = ss.open_run(run)
    names = {s.site_id: s.name for s in reader.sites}
    return reader, [(names[r.site_id], r) for r in reader.observations(stream=stream)]


@pytest.mark.parametrize(
    "mode", [torch.inference_mode, torch.no_grad], ids=["inference", "no_grad"]
)
def test_a_teacher_forward_inside_the_training_forward_counts(tmp_path, mode):
    torch.manual_seed(0)
    model = Distilled(mode)
    opt = torch.optim.SGD(model.student.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        for _ in range(2):
            x = torch.randn(5, 6, generator=g)
            with c.step(opt):
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
    reader, rows = _observations(tmp_path / "run")
    teacher_out = [(n, r) for n, r in rows if n == "teacher.2"]
    assert [r.presence.value for _, r in teacher_out] == ["observed", "observed"]
    s = reader.series("teacher.2", "activation", "sum_squares")
    want = [float(t.square().sum()) for t in model.seen]
    np.testing.assert_allclose(s.values, want, rtol=1e-5)
    assert all(r.presence.value == "observed" for n, r in rows if n.startswith("teacher."))


class Ensemble(nn.Module):
    """``head`` is called normally; ``member`` once normally and once under vmap."""

    def __init__(self, vmapped_only: bool) -> None:
        super().__init__()
        self.vmapped_only = vmapped_only
        self.member = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.func.vmap(self.member)(x.unsqueeze(1)).squeeze(1)
        if not self.vmapped_only:
            h = h + self.member(x)
        return self.head(h)


@pytest.mark.parametrize("vmapped_only", [True, False], ids=["only_vmap", "mixed"])
def test_a_forward_under_vmap_is_disclosed_per_call(tmp_path, vmapped_only):
    torch.manual_seed(0)
    model = Ensemble(vmapped_only)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6)
    want = float(model.member(x).detach().double().square().sum())  # the weights of the step
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        with c.step(opt):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    reader, rows = _observations(tmp_path / "run")
    by = {n: r for n, r in rows}
    assert by["head"].presence.value == "observed"
    member = by["member"]
    if vmapped_only:
        assert member.presence.value == "unsupported"
        assert member.disclosures == ("unsupported:torch_func",)
    else:
        assert member.presence.value == "observed"
        assert "skipped_calls:torch_func" in member.disclosures
        got = reader.series("member", "activation", "sum_squares").values[0]
        assert got == pytest.approx(want, rel=1e-5)  # the plain call alone
    # the parameter-sized streams are untouched by the transform
    _, grads = _observations(tmp_path / "run", "gradient")
    assert len(grads) == 4 and all(r.presence.value == "observed" for _, r in grads)


class SkippingScaler:
    """What ``GradScaler.step`` does on an inf/NaN gradient: it does not call optimizer.step."""

    def __init__(self, skip: set[int]) -> None:
        self.skip, self.calls = skip, 0

    def step(self, opt) -> None:
        if self.calls not in self.skip:
            opt.step()
        self.calls += 1


def _iterations(model, opt, scaler, n, accumulate=1):
    g = torch.Generator().manual_seed(3)
    for _ in range(n):
        opt.zero_grad()
        for _ in range(accumulate):
            model(torch.randn(4, 6, generator=g)).pow(2).mean().backward()
        scaler.step(opt)


def _implicit(tmp_path, skip, accumulate=1):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path), optimizer=opt):
            _iterations(model, opt, SkippingScaler(skip), 6, accumulate)
    return [w for w in caught if "scaler=" in str(w.message)], model


def test_implicit_spelling_with_a_skipping_scaler_and_no_scaler_argument_warns_once(tmp_path):
    found, _ = _implicit(tmp_path, skip={1, 3})
    assert len(found) == 1
    assert "HistoryCollector(model, optimizer=opt, scaler=scaler)" in str(found[0].message)
    assert found[0].filename == __file__  # points at the user's code


@pytest.mark.parametrize("accumulate", [1, 3])
def test_implicit_spelling_that_steps_every_iteration_does_not_warn(tmp_path, accumulate):
    found, _ = _implicit(tmp_path, skip=set(), accumulate=accumulate)
    assert found == []


def test_the_unstepped_iteration_watch_is_pure(tmp_path):
    _, seen = _implicit(tmp_path, skip={1, 3})
    torch.manual_seed(0)
    twin = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    with contextlib.nullcontext():
        _iterations(twin, opt, SkippingScaler({1, 3}), 6)
    for a, b in zip(seen.state_dict().values(), twin.state_dict().values()):
        assert torch.equal(a, b)

"""Optimizer facts: GradScaler skips, the scale in force, two optimizers, bare steps.

Truth comes from outside the collector: whether the optimizer stepped is read from the
parameters themselves (changed or not), the scale in force from ``scaler.get_scale()`` right
before ``scaler.scale(loss)``, updates from parameter snapshots taken by the test.
"""

from __future__ import annotations

import math
import warnings
from contextlib import nullcontext

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope.collect import ALL_STREAMS
from tests.collect.models import ResNetish, TinyGPT
from tests.collect.stepkit import ce, disk_settings, images, tokens


def _scaled_iteration(model, opt, scaler, x, y, poison: bool):
    """One AMP iteration; returns (scale in force, whether the parameters changed)."""
    in_force = scaler.get_scale()
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    scaler.scale(ce(model(x), y)).backward()
    if poison:  # an overflow: GradScaler must skip optimizer.step()
        next(model.parameters()).grad.view(-1)[0] = float("inf")
    scaler.step(opt)
    scaler.update()
    changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    return in_force, changed


SKIPS = {2, 5}  # the last iteration skips too: close() must still record it


def test_gradscaler_skip_explicit_one_step_per_iteration_scale_in_force(tmp_path):
    torch.manual_seed(0)
    model = ResNetish()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    truth = []
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        for i, (x, y) in enumerate(images(6)):
            with c.step(opt, scaler=scaler, examples=len(x)):
                truth.append(_scaled_iteration(model, opt, scaler, x, y, i in SKIPS))
    blocks = ss.open_run(tmp_path / "run").step_blocks()
    assert [b.optimizer_step for b in blocks] == list(range(6))
    assert [b.truth.applied.value for b in blocks] == ["yes" if ch else "no" for _, ch in truth]
    assert [b.truth.scale for b in blocks] == [s for s, _ in truth]
    assert len({s for s, _ in truth}) == 2  # the scale really moved (growth and backoff)
    # a skipped step's gradients were unscaled by scaler.step() (and hold the injected inf)
    h = ss.open_run(tmp_path / "run")
    cells = h.observations("conv1.weight", "gradient")
    assert [r.scale_grad.value for r in cells] == ["unscaled"] * 6
    posinf = {}
    for phase in ("pre_step", "backward"):  # read before a step, or after a skipped one
        ser = h.series("conv1.weight", "gradient", "posinf", phase=phase)
        posinf.update(zip(ser.steps.tolist(), ser.values.tolist()))
    assert posinf == {i: (1.0 if i in SKIPS else 0.0) for i in range(6)}


def test_gradscaler_skip_implicit_one_step_per_iteration(tmp_path):
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    truth = []
    c = ss.HistoryCollector(
        model, cadence=1, settings=disk_settings(tmp_path), optimizer=opt, scaler=scaler
    )
    with c:
        for i, (x, y) in enumerate(tokens(6)):
            truth.append(_scaled_iteration(model, opt, scaler, x, y, i in SKIPS))
    h = ss.open_run(tmp_path / "run")
    blocks = h.step_blocks()
    assert [b.optimizer_step for b in blocks] == list(range(6))  # never two iterations merged
    assert [b.truth.applied.value for b in blocks] == ["yes" if ch else "no" for _, ch in truth]
    assert [b.truth.scale for b in blocks] == [s for s, _ in truth]
    # each step's activation rows hold exactly one iteration's forward: 3 x length x vocab logits
    lengths = [x.shape[1] for x, _ in tokens(6)]
    totals = h.series("lm_head", "activation", "total")
    assert totals.values.tolist() == [3 * t * 40 for t in lengths]
    # the scaler was given: gradients read in the pre-step hook are known to be unscaled
    grads = h.observations("ln_f.weight", "gradient")
    grads = [r for r in grads if r.presence.value == "observed"]  # skipped: never read
    assert [(r.step, r.scale_grad.value) for r in grads] == [
        (i, "unscaled") for i in range(6) if i not in SKIPS
    ]
    assert all(b.truth.unscaled.value == "yes" for b in blocks if b.truth.applied.value == "yes")
    # a skipped step records no update; an applied one does
    upd = h.series("ln_f.weight", "update", "total")
    assert sorted(upd.steps.tolist()) == [i for i in range(6) if i not in SKIPS]


@pytest.mark.parametrize("spelling", ["list", "one_per_transaction"])
def test_two_optimizers_each_own_their_parameters_updates(tmp_path, spelling):
    """Each optimizer reduces only its own rows: no fake zero updates of the other's."""
    torch.manual_seed(0)
    model = TinyGPT()
    head = [model.ln_f.weight, model.ln_f.bias]
    body = [p for p in model.parameters() if all(p is not q for q in head)]
    opt_body = torch.optim.AdamW(body, lr=1e-3)
    opt_head = torch.optim.SGD(head, lr=0.1, momentum=0.9)
    named = dict(model.named_parameters())
    want: dict[tuple[str, int], float] = {}
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        for step, (x, y) in enumerate(tokens(6)):
            declared = (
                [opt_body, opt_head] if spelling == "list" else [opt_body, opt_head][step % 2]
            )  # one_per_transaction: both hooks are attached from step 1 on
            with c.step(declared, examples=len(x)):
                opt_body.zero_grad()
                opt_head.zero_grad()
                ce(model(x), y).backward()
                before = {n: p.detach().clone() for n, p in named.items()}
                opt_body.step()
                opt_head.step()
                for n, p in named.items():
                    want[(n, step)] = float((p.detach() - before[n]).double().pow(2).sum())
    h = ss.open_run(tmp_path / "run")
    checked = 0
    for site in ("ln_f.weight", "ln_f.bias", "h.0.ln_1.weight", "h.0.mlp.0.bias", "wpe.weight"):
        s = h.series(site, "update", "sum_squares")
        assert s.steps.tolist() == list(range(6))
        for step, got in zip(s.steps.tolist(), s.values.tolist()):
            if spelling != "list" and step == 0 and site.startswith("ln_f"):
                assert math.isnan(got)  # opt_head was not declared yet: absent, never zero
                continue
            assert want[(site, step)] > 0  # every parameter really moved
            assert math.isclose(got, want[(site, step)], rel_tol=1e-5), (site, step)
            checked += 1
    assert checked == (30 if spelling == "list" else 28)


def test_a_bare_optimizer_step_after_explicit_steps_is_refused_not_recorded(tmp_path):
    torch.manual_seed(0)
    model = ResNetish()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = images(4)
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        x, y = data[0]
        with c.step(opt, examples=4):
            opt.zero_grad()
            ce(model(x), y).backward()
            opt.step()
        x, y = data[1]
        opt.zero_grad()
        ce(model(x), y).backward()
        with pytest.warns(RuntimeWarning, match="outside") as said:
            opt.step()  # bare: not a step of this collector
        assert [w.filename for w in said] == [__file__]  # at this line, not in stepscope/torch
        with pytest.raises(ss.Refusal) as err:
            with c.step(opt, examples=4):
                pass
        assert err.value.code == "step_transaction_required"
        for x, y in data[2:]:  # the collector stays usable
            with c.step(opt, examples=4):
                opt.zero_grad()
                ce(model(x), y).backward()
                opt.step()
    blocks = ss.open_run(tmp_path / "run").step_blocks()
    assert [(b.optimizer_step, b.provenance.value) for b in blocks] == [
        (0, "explicit"),
        (1, "explicit"),
        (2, "explicit"),
    ]
    assert [b.examples_seen for b in blocks] == [4, 8, 12]


def test_implicit_steps_are_not_affected_by_the_bare_step_rule(tmp_path):
    torch.manual_seed(0)
    model = ResNetish()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ss.HistoryCollector(model, settings=disk_settings(tmp_path), optimizer=opt):
            for x, y in images(3):
                opt.zero_grad()
                ce(model(x), y).backward()
                opt.step()
    blocks = ss.open_run(tmp_path / "run").step_blocks()
    assert [b.provenance.value for b in blocks] == ["implicit"] * 3


def _amp_run(tmp_path, observe: str | None):
    torch.manual_seed(0)
    model = TinyGPT()
    head = [model.ln_f.weight, model.ln_f.bias]
    body = [p for p in model.parameters() if all(p is not q for q in head)]
    opts = [torch.optim.AdamW(body, lr=1e-3), torch.optim.SGD(head, lr=0.1, momentum=0.9)]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
    c = None
    if observe == "implicit":
        c = ss.HistoryCollector(
            model,
            cadence=1,
            settings=disk_settings(tmp_path, "i"),
            optimizer=opts[0],
            scaler=scaler,
        )
    elif observe == "explicit":
        c = ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path, "e"))
    losses = []
    for i, (x, y) in enumerate(tokens(5)):
        ctx = c.step(opts, scaler=scaler, examples=3) if observe == "explicit" else None
        if ctx is not None:
            ctx.__enter__()
        for o in opts:
            o.zero_grad()
        loss = ce(model(x), y)
        scaler.scale(loss).backward()
        if i == 2:
            model.wte.weight.grad.view(-1)[0] = float("inf")
        for o in opts:
            scaler.step(o)
        scaler.update()
        losses.append(loss.detach())
        if ctx is not None:
            ctx.__exit__(None, None, None)
    if c is not None:
        c.close()
    return (
        torch.stack(losses),
        model.state_dict(),
        [o.state_dict()["state"] for o in opts],
        scaler.state_dict(),
    )


def test_scaler_and_two_optimizer_observation_is_bitwise_pure(tmp_path):
    base = _amp_run(tmp_path, None)
    for observe in ("implicit", "explicit"):
        losses, state, opt_states, scaler_state = _amp_run(tmp_path, observe)
        assert torch.equal(losses, base[0]), observe
        for k in state:
            assert torch.equal(state[k], base[1][k]), (observe, k)
        for got, want in zip(opt_states, base[2]):
            for i in want:
                for k, v in want[i].items():
                    same = torch.equal(got[i][k], v) if torch.is_tensor(v) else got[i][k] == v
                    assert same, (observe, i, k)
        assert scaler_state == base[3]


class NestedAdamW(torch.optim.AdamW):
    """Its ``step`` calls the parent's, which torch has wrapped too: the hooks run twice."""

    def step(self, closure=None):  # type: ignore[override]
        return super().step(closure)


class NestedSGD(torch.optim.SGD):
    def step(self, closure=None):  # type: ignore[override]
        return super().step(closure)


@pytest.mark.parametrize("spelling", ["implicit", "explicit"])
@pytest.mark.parametrize("case", ["gpt", "resnet"])
def test_an_optimizer_subclass_calling_super_step_is_one_step(tmp_path, case, spelling):
    """Used to record two steps per iteration under the implicit spelling (the second empty)."""
    torch.manual_seed(0)
    if case == "gpt":
        model, cls, batches, kw = TinyGPT(), NestedAdamW, tokens(4), {"lr": 1e-2}
    else:
        model, cls, batches, kw = ResNetish(), NestedSGD, images(4), {"lr": 0.05, "momentum": 0.9}
    cls.__mro__[1]([torch.zeros(1, requires_grad=True)], **kw)  # the parent's step is wrapped
    opt = cls(model.parameters(), **kw)
    fired: list[int] = []
    opt.register_step_pre_hook(lambda *_: fired.append(1))
    settings = disk_settings(tmp_path, update_sample_size=1 << 20)  # every update exact
    implicit = {"optimizer": opt} if spelling == "implicit" else {}
    c = ss.HistoryCollector(model, streams=ALL_STREAMS, cadence=1, settings=settings, **implicit)
    named = dict(model.named_parameters())
    grads, updates = [], []
    for x, y in batches:
        with c.step(opt, examples=len(x)) if spelling == "explicit" else nullcontext():
            opt.zero_grad()
            ce(model(x), y).backward()
            grads.append({n: p.grad.double().pow(2).sum().item() for n, p in named.items()})
            before = {n: p.detach().double().clone() for n, p in named.items()}
            opt.step()
            updates.append(
                {n: (p.detach().double() - before[n]).pow(2).sum().item() for n, p in named.items()}
            )
    c.close()
    assert len(fired) == 2 * len(batches)  # torch really ran the step hooks twice a step
    h = ss.open_run(tmp_path / "run")
    assert h.steps.tolist() == list(range(len(batches)))
    assert [b.optimizer_step for b in h.step_blocks()] == list(range(len(batches)))
    for n in named:
        got = h.series(n, "gradient", "sum_squares").values
        np.testing.assert_allclose(got, [g[n] for g in grads], rtol=1e-9)
        got = h.series(n, "update", "sum_squares").values
        np.testing.assert_allclose(got, [u[n] for u in updates], rtol=1e-6)  # f32 diff


@pytest.mark.parametrize("case", ["gpt", "resnet"])
def test_an_optimizer_stepped_twice_in_one_step_writes_no_false_update(tmp_path, case):
    """Used to fold two optimizer steps' updates into one row (``total`` twice the parameter's
    size, a mixture of two updates), with the first step's gradients and intermediate values,
    silently. Now: update rows ``unsupported:several_optimizer_steps``, gradients of the last
    optimizer step, values at the step's end, one warning. A second optimizer stepped once in the
    same transaction keeps its ordinary rows."""
    torch.manual_seed(0)
    if case == "gpt":
        model, batches = TinyGPT(), tokens(6)
        twice, once = (
            model.h.parameters(),
            [p for n, p in model.named_parameters() if not n.startswith("h.")],
        )
    else:
        model, batches = ResNetish(), images(6)
        twice, once = (
            model.layer1.parameters(),
            [p for n, p in model.named_parameters() if not n.startswith("layer1.")],
        )
    inner = torch.optim.SGD(twice, lr=0.05, momentum=0.9)
    outer = torch.optim.Adam(once, lr=1e-2)
    inner_ids = {id(p) for g in inner.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    settings = disk_settings(tmp_path, update_sample_size=1 << 20)
    c = ss.HistoryCollector(model, streams=ALL_STREAMS, cadence=1, settings=settings)
    grads, values, updates = [], [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(0, len(batches), 2):
            with c.step([inner, outer], examples=6):
                before = {n: p.detach().double().clone() for n, p in named.items()}
                for j, (x, y) in enumerate(batches[k : k + 2]):  # two inner steps, one outer
                    inner.zero_grad()
                    if j == 0:
                        outer.zero_grad()
                    ce(model(x), y).backward()
                    last = {n: p.grad.double().pow(2).sum().item() for n, p in named.items()}
                    inner.step()
                outer.step()
            grads.append(last)
            values.append({n: p.detach().double().pow(2).sum().item() for n, p in named.items()})
            updates.append(
                {n: (p.detach().double() - before[n]).pow(2).sum().item() for n, p in named.items()}
            )
    c.close()
    said = [w for w in caught if "several_optimizer_steps" in str(w.message)]
    assert len(said) == 1 and "SGD.step() ran more than once" in str(said[0].message)
    assert said[0].filename == __file__  # it points at the user's optimizer.step() line
    h = ss.open_run(tmp_path / "run")
    assert h.steps.tolist() == [0, 1, 2]
    for n, p in named.items():
        got = h.series(n, "gradient", "sum_squares").values
        np.testing.assert_allclose(got, [g[n] for g in grads], rtol=1e-9)
        got = h.series(n, "parameter", "sum_squares").values
        np.testing.assert_allclose(got, [v[n] for v in values], rtol=1e-9)
        cells = h.observations(n, "update")
        if id(p) in inner_ids:
            assert [(r.presence.value, r.disclosures) for r in cells] == [
                ("unsupported", ("unsupported:several_optimizer_steps",))
            ] * 3
            for stream in ("gradient", "parameter"):
                assert all(
                    "several_optimizer_steps" in r.disclosures for r in h.observations(n, stream)
                )
        else:  # the once-stepped optimizer: the true update, no note
            assert [r.presence.value for r in cells] == ["observed"] * 3
            got = h.series(n, "update", "sum_squares").values
            np.testing.assert_allclose(got, [u[n] for u in updates], rtol=1e-6)  # f32 diff
            assert not any(
                "several_optimizer_steps" in r.disclosures for r in h.observations(n, "gradient")
            )


@pytest.mark.parametrize("case, shared", [("gpt", "wte.weight"), ("resnet", "conv1.weight")])
def test_a_parameter_in_two_optimizers_writes_no_false_update(tmp_path, case, shared):
    """A parameter two optimizers own, both stepped in one transaction, used to get one update
    row folded from both updates (``total`` twice its size) and its value after the first
    optimizer's step, silently. Now its update row is ``unsupported:several_optimizer_steps``
    and its value is the step's end; every other row is as with one optimizer."""
    torch.manual_seed(0)
    model, batches = (TinyGPT(), tokens(3)) if case == "gpt" else (ResNetish(), images(3))
    named = dict(model.named_parameters())
    body = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # every parameter
    extra = torch.optim.Adam([named[shared]], lr=1e-2)  # and the shared one again
    settings = disk_settings(tmp_path, update_sample_size=1 << 20)
    c = ss.HistoryCollector(model, streams=ALL_STREAMS, cadence=1, settings=settings)
    grads, values, updates = [], [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x, y in batches:
            with c.step([body, extra], examples=len(x)):
                body.zero_grad()
                extra.zero_grad()
                ce(model(x), y).backward()
                grads.append({n: p.grad.double().pow(2).sum().item() for n, p in named.items()})
                before = {n: p.detach().double().clone() for n, p in named.items()}
                body.step()
                extra.step()
            values.append({n: p.detach().double().pow(2).sum().item() for n, p in named.items()})
            updates.append(
                {n: (p.detach().double() - before[n]).pow(2).sum().item() for n, p in named.items()}
            )
    c.close()
    said = [w for w in caught if "several_optimizer_steps" in str(w.message)]
    assert len(said) == 1 and "Adam.step() stepped parameters another optimizer" in str(
        said[0].message
    )
    h = ss.open_run(tmp_path / "run")
    for n in named:
        np.testing.assert_allclose(
            h.series(n, "gradient", "sum_squares").values, [g[n] for g in grads], rtol=1e-9
        )
        np.testing.assert_allclose(
            h.series(n, "parameter", "sum_squares").values, [v[n] for v in values], rtol=1e-9
        )
        cells = h.observations(n, "update")
        if n == shared:
            assert [(r.presence.value, r.disclosures) for r in cells] == [
                ("unsupported", ("unsupported:several_optimizer_steps",))
            ] * 3
        else:
            assert [r.presence.value for r in cells] == ["observed"] * 3
            np.testing.assert_allclose(
                h.series(n, "update", "sum_squares").values,
                [u[n] for u in updates],
                rtol=1e-6,  # f32 difference
            )

"""The update stream's native sampling: one gather per step gives the per-row path's rows.

Truth comes from outside the code under test: ``index_select`` and a Python loop for the C
gather; the per-row path (``UpdateSampler.native = False``) for the rows a collector records on
real models of the suite's matrix, bit for bit; and the test's own reading of each parameter at
the row's sample indices around ``opt.step()`` (count, sum, min, max), also across model surgery
and storage swaps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from stepscope.collect import Cadence, HistoryCollector, WatchSettings
from stepscope.collect import updates as updates_module
from stepscope.history import Presence, Stream
from stepscope.history.batch import member_of
from stepscope.stats import SPINE_FIELDS, _native
from stepscope.stats.gather import SampleGather, gatherable
from tests.collect.models import Case, ResNetish, TinyGPT, _ce, _image, _tokens, train

pytestmark = pytest.mark.skipif(_native.loaded() is None, reason="no native kernel library")

SAMPLE = 64  # small enough that most parameters are sampled, small ones taken whole


def lib():
    return _native.loaded()


# ----------------------------------------------------------------------- the C gather itself


def brute_force(src: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    flat = src.reshape(-1)
    if idx is None:
        return flat.clone()
    return torch.stack([flat[int(i)] for i in idx]) if len(idx) else flat[:0].clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gather_equals_index_select_and_a_loop_then_after_minus_before(dtype):
    g = torch.Generator().manual_seed(5)
    shapes = [(300,), (17, 33), (1,), (0,), (4, 5, 6), (2048,)]
    tensors = [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    tensors[1].view(-1)[[3, 7, 11]] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=dtype)
    indices: list[torch.Tensor | None] = []
    for k, t in enumerate(tensors):
        n = t.numel()
        if k in (2, 3):  # whole tensors: the NULL index (one element, and an empty tensor)
            indices.append(None)
        elif k == 4:  # an empty sample of a non-empty tensor
            indices.append(torch.empty(0, dtype=torch.int64))
        else:  # sorted like update_indices, and one unsorted with repeats
            idx = torch.randperm(n, generator=g)[: max(1, n // 3)]
            if k == 1:  # the NaN, the infinity and the -0.0 are sampled
                idx = torch.cat([idx, torch.tensor([3, 7, 11])]).unique()
            indices.append(idx.sort().values if k != 5 else torch.cat([idx, idx[:5]]))
    plan = SampleGather(tensors, indices, lib())
    assert plan.bind(tensors)
    plan.gather(subtract=False)
    before = []
    for t, idx, got in zip(tensors, indices, plan.samples):
        want = t.reshape(-1) if idx is None else t.reshape(-1).index_select(0, idx)
        assert got.dtype == dtype and got.is_contiguous()
        assert torch.equal(got.nan_to_num(9.0), want.nan_to_num(9.0))
        assert torch.equal(got.nan_to_num(9.0), brute_force(t, idx).nan_to_num(9.0))
        before.append(want.clone())
    for t in tensors:  # an optimizer step, in place
        t.mul_(1.0 + 1e-7).add_(torch.randn(t.shape, generator=g, dtype=dtype) * 1e-3)
    assert plan.bind(tensors)
    plan.gather(subtract=True)
    for t, idx, got, b in zip(tensors, indices, plan.samples, before):
        after = t.reshape(-1) if idx is None else t.reshape(-1).index_select(0, idx)
        want = after.clone().sub_(b)  # what the per-row path computes
        assert torch.equal(got.nan_to_num(9.0), want.nan_to_num(9.0))


def test_float64_stays_float64_where_float32_would_round_the_update_away():
    p = torch.full((10,), 1.0, dtype=torch.float64)
    plan = SampleGather([p], [torch.tensor([0, 9])], lib())
    plan.bind([p])
    plan.gather(subtract=False)
    p.add_(1e-12)
    plan.bind([p])
    plan.gather(subtract=True)
    assert plan.samples[0].dtype == torch.float64
    assert plan.samples[0].tolist() == [(1.0 + 1e-12) - 1.0] * 2 != [0.0, 0.0]


def test_out_of_range_indices_are_refused_when_the_plan_is_built():
    t = torch.zeros(10)
    for bad in (torch.tensor([0, 10]), torch.tensor([-1, 3])):
        with pytest.raises(ValueError, match="outside"):
            SampleGather([t], [bad], lib())
    with pytest.raises(ValueError, match="contiguous CPU"):
        SampleGather([torch.zeros(4, 4).t()], [None], lib())


def test_bind_refuses_a_tensor_that_no_longer_fits_the_plan():
    t = torch.zeros(6, 4)
    plan = SampleGather([t], [torch.tensor([1, 23])], lib())
    assert plan.bind([t])
    assert not plan.bind([torch.zeros(6, 3)])  # fewer elements: an index would read outside
    assert not plan.bind([torch.zeros(6, 4, dtype=torch.float64)])
    assert not plan.bind([torch.zeros(4, 6).t()])  # same size, not contiguous
    assert not plan.bind([torch.zeros(6, 4, dtype=torch.bfloat16)])
    assert not plan.bind([t, t])
    assert gatherable(nn.Parameter(torch.zeros(3))) and not gatherable(torch.zeros(3).half())


# -------------------------------------------------------- collector: native rows == per-row rows


class WithOddParameters(nn.Module):
    """ResNetish plus a bf16 gain and a non-contiguous weight: both take the per-row path."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ResNetish()
        self.gain = nn.Parameter(torch.ones(5, dtype=torch.bfloat16))
        self.mix = nn.Parameter(torch.eye(5).add(0.01).t())  # a transposed view: not contiguous

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.net(x) * self.gain.float()) @ self.mix


def sgd(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)


def adam(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(m.parameters(), lr=1e-2)


MATRIX = {
    "gpt_tied_sgd": Case("gpt", TinyGPT, _tokens(40), _ce, optimizer=sgd),
    "gpt_tied_adam": Case("gpt", TinyGPT, _tokens(40), _ce, optimizer=adam),
    "resnet_bn_sgd": Case("resnet", ResNetish, _image, _ce, optimizer=sgd, micro_batches=2),
    "resnet_bn_adam": Case("resnet", ResNetish, _image, _ce, optimizer=adam),
    "gpt_float64_adam": Case("gpt64", lambda: TinyGPT().double(), _tokens(40), _ce, optimizer=adam),
    "resnet_bf16_gain_sgd": Case("odd", WithOddParameters, _image, _ce, optimizer=sgd),
}
#: rows that must fall back to the per-row path, per case
PER_ROW = {"resnet_bf16_gain_sgd": {"gain", "mix"}}


def factory(native: bool):
    def make(model, opt):
        c = HistoryCollector(
            model,
            streams=("update",),
            cadence=Cadence(1, 2),  # histograms of the updates every other step
            settings=WatchSettings(update_sample_size=SAMPLE),
        )
        c._steps.updates.native = native
        return c

    return make


def update_rows(c) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray | None]]:
    """``{(site, step): (spine row, histogram row or None)}`` of the update stream, from the ring."""
    out = {}
    for rb in c.ring.blocks():
        for b in rb.batches:
            if b.stream.value != "update":
                continue
            hists = {}
            if b.hist_rows is not None and b.histograms is not None:
                hists = {int(r): b.histograms[k] for k, r in enumerate(b.hist_rows)}
            for j, sid in enumerate(b.site_ids):
                assert member_of(Presence, b.presence[j]) is Presence.OBSERVED
                key = (c.sites[int(sid)].name, rb.block.optimizer_step)
                out[key] = (b.spines[j], hists.get(j))
    return out


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_native_update_rows_equal_the_per_row_path_bit_for_bit(name):
    case = MATRIX[name]
    native = train(case, factory(True), steps=5, evaluations=False)
    per_row = train(case, factory(False), steps=5, evaluations=False)
    assert torch.equal(native["losses"], per_row["losses"])  # the same training, observed twice
    sampler = native["collector"]._steps.updates
    (plan,) = sampler._plans.values()
    assert plan.native, "the native gather never ran: the comparison would prove nothing"
    assert {r.site for r in plan.fallback} == PER_ROW.get(name, set())
    assert not per_row["collector"]._steps.updates._plans
    got, want = update_rows(native["collector"]), update_rows(per_row["collector"])
    n_rows = sum(1 for r in native["collector"].rows if r.stream == "update")
    assert set(got) == set(want) and len(got) == 5 * n_rows
    assert any(h is not None for _, h in got.values())
    for key, (spine, hist) in got.items():
        assert np.array_equal(spine, want[key][0], equal_nan=True), key
        assert (hist is None) == (want[key][1] is None), key
        if hist is not None:
            assert np.array_equal(hist, want[key][1]), key


# ------------------------------------------------- collector: against the test's own reading


FIELD = {name: i for i, name in enumerate(SPINE_FIELDS)}


class Reading:
    """The test's own sample of every update row around ``opt.step()``: the values at the row's
    indices before and after, differenced in the parameter's dtype."""

    def __init__(self, collector: HistoryCollector) -> None:
        self.collector = collector
        self.before: dict[str, torch.Tensor] = {}
        self.deltas: dict[tuple[str, int], torch.Tensor] = {}

    def _at(self, p: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
        flat = p.detach().reshape(-1).clone()
        return flat if idx is None else torch.stack([flat[int(i)] for i in idx])

    def rows(self):
        return [r for r in self.collector.rows if r.stream == "update" and r.param is not None]

    def before_step(self) -> None:
        self.before = {r.site: self._at(r.param, r.update_index) for r in self.rows()}

    def after_step(self, step: int) -> None:
        for r in self.rows():
            self.deltas[(r.site, step)] = self._at(r.param, r.update_index) - self.before[r.site]


def assert_rows_match(c: HistoryCollector, reading: Reading, steps: range) -> int:
    rows = update_rows(c)
    checked = 0
    for (site, step), delta in reading.deltas.items():
        if step not in steps:
            continue
        spine = rows[(site, step)][0]
        d = delta.double()
        assert spine[FIELD["total"]] == d.numel(), (site, step)
        assert spine[FIELD["min"]] == float(d.min()) and spine[FIELD["max"]] == float(d.max())
        want = math.fsum(d.tolist())
        assert math.isclose(spine[FIELD["sum"]], want, rel_tol=1e-12, abs_tol=1e-15), (site, step)
        checked += 1
    return checked


def step(c, model, opt, reading, x, y, i) -> None:
    with c.step(opt):
        opt.zero_grad()
        _ce(model(x), y).backward()
        reading.before_step()
        opt.step()
        reading.after_step(i)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_update_rows_equal_the_sampled_values_read_around_the_step(dtype):
    torch.manual_seed(0)
    model = TinyGPT().to(dtype)
    opt = adam(model)
    c = factory(True)(model, opt)
    reading = Reading(c)
    batch = _tokens(40)
    g = torch.Generator().manual_seed(1)
    for i in range(4):
        step(c, model, opt, reading, *batch(g, i), i)
    c.close()
    sampled = [r for r in reading.rows() if r.update_index is not None]
    assert sampled and len(sampled) < len(reading.rows())  # both kinds of rows
    assert assert_rows_match(c, reading, range(4)) == 4 * len(reading.rows())


def mlp_run(width: int, hidden: int, seed: int):
    """A Linear-Tanh-Linear model, its SGD, a native collector, the test's own reading and a
    batch source: what the tests below train."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    c = factory(True)(model, opt)
    g = torch.Generator().manual_seed(seed)

    def batch():
        return torch.randn(8, width, generator=g), torch.randint(0, 3, (8,), generator=g)

    return model, opt, c, Reading(c), batch


def test_model_surgery_and_a_swapped_storage_still_give_the_right_rows(monkeypatch):
    built = []
    real = updates_module.SampleGather

    def counting(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(updates_module, "SampleGather", counting)
    model, opt, c, reading, batch = mlp_run(12, 16, seed=2)
    for i in range(2):
        step(c, model, opt, reading, *batch(), i)
    assert len(built) == 1  # planned once, reused while the parameters stay
    model[2] = nn.Linear(16, 3)  # surgery: a new Linear replaces the head between steps
    opt.add_param_group({"params": list(model[2].parameters())})
    for i in range(2, 4):
        step(c, model, opt, reading, *batch(), i)
    assert len(built) == 2  # re-planned for the new head
    assert len(c._steps.updates._plans) == 1  # the old plan (and the old head it held) is gone
    old = model[0].weight.data  # load_state_dict-like: new storage under the same parameter
    model[0].weight.data = old.clone()
    old.fill_(123.0)  # a stale address would read this
    for i in range(4, 6):
        step(c, model, opt, reading, *batch(), i)
    c.close()
    sites = {r.site for r in reading.rows()}
    assert {"2.weight", "0.weight"} <= sites
    assert [r.param is model[2].weight for r in reading.rows() if r.site == "2.weight"] == [True]
    assert assert_rows_match(c, reading, range(6)) == 6 * len(sites)


class SwapToTransposed(torch.optim.Optimizer):
    """Old-style SGD that assigns ``p.data`` (new storage every step), a weight's as a
    non-contiguous copy: the pre-step sample is gathered natively, the post-step one cannot be.
    (It does not call a hooked ``super().step()``: the step hooks would run twice.)"""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    new = p - group["lr"] * p.grad
                    p.data = new.t().contiguous().t() if p.dim() == 2 else new


def test_a_parameter_made_non_contiguous_inside_the_step_falls_back_per_row():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = SwapToTransposed(model.parameters(), lr=0.1)
    c = factory(True)(model, opt)
    reading = Reading(c)
    g = torch.Generator().manual_seed(3)
    sampler = c._steps.updates
    for i in range(3):
        x, y = torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)
        step(c, model, opt, reading, x, y, i)
        assert not model[0].weight.is_contiguous()
        if i == 0:  # gathered natively before the step, differenced per row after it
            assert not sampler._plans
    c.close()
    (plan,) = sampler._plans.values()  # re-planned: the weights now go per row
    assert {r.site for r in plan.fallback} == {"0.weight", "2.weight"} and plan.native
    assert assert_rows_match(c, reading, range(3)) == 3 * len(reading.rows())


def test_two_optimizers_each_get_their_own_plan_and_right_rows():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
    body = torch.optim.SGD(model[0].parameters(), lr=0.1, momentum=0.9)
    head = torch.optim.Adam(model[2].parameters(), lr=1e-2)
    c = factory(True)(model, body)
    reading = Reading(c)
    g = torch.Generator().manual_seed(4)
    for i in range(3):
        x, y = torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)
        with c.step([body, head]):
            body.zero_grad()
            head.zero_grad()
            _ce(model(x), y).backward()
            reading.before_step()
            body.step()
            head.step()
            reading.after_step(i)
    c.close()
    plans = list(c._steps.updates._plans.values())
    assert sorted(r.site for p in plans for r in p.native) == sorted(
        ["0.weight", "0.bias", "2.weight", "2.bias"]
    )
    assert len(plans) == 2
    assert assert_rows_match(c, reading, range(3)) == 3 * 4


def test_the_pure_torch_backend_samples_every_row_one_by_one():
    def make(model, opt):
        settings = WatchSettings(update_sample_size=SAMPLE, kernel_backend="torch")
        return HistoryCollector(model, streams=("update",), cadence=1, settings=settings)

    run = train(MATRIX["gpt_tied_sgd"], make, steps=2, evaluations=False)
    c = run["collector"]
    assert not c._steps.updates._plans
    assert len(update_rows(c)) == 2 * sum(1 for r in c.rows if r.stream == "update") > 0


def test_a_transposed_view_at_the_same_address_is_sampled_in_its_logical_order():
    """``p.data = p.data.t()`` keeps the storage address: the plan must not read raw memory order."""
    model, opt, c, reading, batch = mlp_run(80, 80, seed=3)  # a sampled square weight
    for i in range(2):
        step(c, model, opt, reading, *batch(), i)
    weight = model[0].weight
    address = weight.data_ptr()
    with torch.no_grad():
        weight.data = weight.data.t()  # same memory, now a non-contiguous view
    assert weight.data_ptr() == address and not weight.is_contiguous()
    for i in range(2, 4):
        step(c, model, opt, reading, *batch(), i)
    c.close()
    assert any(r.update_index is not None for r in reading.rows())
    assert assert_rows_match(c, reading, range(4)) == 4 * len(reading.rows())


@pytest.mark.parametrize("phase", ["snapshot", "deltas"])
def test_an_update_sample_that_raises_is_recorded_failed_and_training_goes_on(phase, monkeypatch):
    real = getattr(updates_module.UpdateSampler, phase)
    calls = []

    def flaky(self, rows):
        calls.append(1)
        if len(calls) == 2:  # the second step's sampling fails
            raise RuntimeError("sampling failed")
        result = real(self, rows)
        return list(result) if phase == "deltas" else result

    monkeypatch.setattr(updates_module.UpdateSampler, phase, flaky)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
    twin = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
    twin.load_state_dict(model.state_dict())
    opt, opt_twin = sgd(model), sgd(twin)
    c = factory(True)(model, opt)
    g = torch.Generator().manual_seed(4)
    presence = []
    for _ in range(3):
        x, y = torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)
        with c.step(opt):
            opt.zero_grad()
            _ce(model(x), y).backward()
            opt.step()
        opt_twin.zero_grad()
        _ce(twin(x), y).backward()
        opt_twin.step()
        (batch,) = [b for b in c.last_batches if b.stream is Stream.UPDATE]
        presence.append((batch.presence.tolist(), batch.row_disclosures))
    c.close()
    for p, q in zip(model.parameters(), twin.parameters()):  # training was not disturbed
        assert torch.equal(p, q)
    kinds = [[member_of(Presence, v) for v in p] for p, _ in presence]
    assert all(k is Presence.OBSERVED for k in kinds[0] + kinds[2])
    assert kinds[1] and all(k is Presence.CAPTURE_FAILED for k in kinds[1])
    assert all(d == ("capture_failed:RuntimeError",) for d in presence[1][1])

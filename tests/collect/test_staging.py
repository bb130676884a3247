"""``collect/staging.py``: staged rows equal torch's own numbers; what cannot be reduced is
recorded (``unsupported`` / ``capture_failed``), never raised."""

from __future__ import annotations

import pytest
import torch

from stepscope.collect.sites import SiteRow
from stepscope.collect.staging import Reducer
from stepscope.collect.step import StepState
from stepscope.collect.write import host_copy
from stepscope.stats import SPINE_FIELDS, HistogramDescriptor

CPU = torch.device("cpu")


def _state(due: bool = True) -> StepState:
    return StepState(step=0, spine_due={"parameter": due}, hist_due={"parameter": False})


def _rows(n: int) -> list[SiteRow]:
    module = torch.nn.Linear(1, 1)
    return [SiteRow(i, "parameter", f"p{i}", "Linear", module) for i in range(n)]


def _spine(reducer: Reducer, row: int) -> dict[str, float]:
    spines, _ = host_copy(reducer.stagings, False)[CPU]
    return dict(zip(SPINE_FIELDS, spines[row].tolist()))


def _oracle(t: torch.Tensor) -> dict[str, float]:
    x = t.detach().to(torch.float64).reshape(-1)
    return {
        "total": float(x.numel()),
        "sum": float(x.sum()),
        "sum_squares": float((x * x).sum()),
        "min": float(x.min()),
        "max": float(x.max()),
    }


def test_reduce_many_rows_equal_torch_float64_sums():
    torch.manual_seed(0)
    tensors = [torch.randn(7, 5), torch.randn(300) * 3, torch.randn(2, 3, 4).half()]
    state = _state()
    reducer = Reducer(len(tensors), HistogramDescriptor(), "auto", lambda: state)
    rows = _rows(len(tensors))
    reducer.reduce_many("parameter", list(zip(rows, tensors)))
    for row, t in zip(rows, tensors):
        got = _spine(reducer, row.index)
        for name, want in _oracle(t).items():
            assert abs(got[name] - want) <= 1e-9 * max(1.0, abs(want)), (row.site, name)
    assert state.stream_s["parameter"] > 0  # the reduction's seconds are charged to its stream


def test_single_and_multi_tensor_reductions_agree():
    torch.manual_seed(1)
    t = torch.randn(64, 3)
    one = Reducer(1, HistogramDescriptor(), "auto", _state)
    many = Reducer(1, HistogramDescriptor(), "auto", _state)
    row = _rows(1)[0]
    one.reduce(row, t)
    many.reduce_many("parameter", [(row, t)])
    assert _spine(one, 0) == _spine(many, 0)


def test_unreducible_tensors_are_recorded_not_raised():
    state = _state()
    reducer = Reducer(3, HistogramDescriptor(), "auto", lambda: state)
    rows = _rows(3)
    reducer.reduce(rows[0], torch.randn(4, dtype=torch.complex64))
    reducer.reduce_many(
        "parameter", [(rows[1], torch.randn(4, dtype=torch.complex64)), (rows[2], "not a tensor")]
    )
    assert state.unsupported == {0: "complex:complex64", 1: "complex:complex64"}
    assert state.failed == {2: "AttributeError"}
    assert not any(st.fired.any() for st in reducer.stagings.values())


def test_nothing_is_staged_when_not_recording_or_not_due():
    rows = _rows(1)
    idle = Reducer(1, HistogramDescriptor(), "auto", lambda: None)  # a telemetry window
    idle.reduce(rows[0], torch.ones(3))
    idle.reduce_many("parameter", [(rows[0], torch.ones(3))])
    assert idle.stagings == {}
    state = _state(due=False)
    off = Reducer(1, HistogramDescriptor(), "auto", lambda: state)
    off.reduce(rows[0], torch.ones(3))
    assert off.stagings == {} and state.stream_s == {}


def test_a_batch_the_native_call_refuses_falls_back_row_by_row_without_double_counting(
    monkeypatch,
):
    state = _state()
    reducer = Reducer(2, HistogramDescriptor(), "auto", lambda: state)
    rows = _rows(2)
    good, other = torch.randn(5, 3), torch.randn(7)
    calls = []

    def refuse(self, *args, **kwargs):  # the multi-tensor call fails after nothing was staged
        calls.append(args)
        raise RuntimeError("native call refused the batch")

    monkeypatch.setattr("stepscope.collect.staging.Staging._native_many", refuse)
    monkeypatch.setattr("stepscope.collect.staging.Staging.write_many", refuse)
    reducer.reduce_many("parameter", [(rows[0], good), (rows[1], other)])
    assert len(calls) == 2 and state.failed == {} and state.unsupported == {}
    for i, t in enumerate((good, other)):
        got = _spine(reducer, i)
        for k, v in _oracle(t).items():
            assert abs(got[k] - v) <= 1e-6 * max(1.0, abs(v)), (i, k)
    assert reducer.stagings[CPU].fired.tolist() == [1, 1]  # each row reduced once


# ------------------------------------------- the one-call native path of the parameter streams


def _model_tensors() -> list[torch.Tensor]:
    """Parameters and gradients of a CNN with BatchNorm, plus a float64 layer's."""
    torch.manual_seed(3)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 10),
    )  # fmt: skip
    wide = torch.nn.Linear(9, 4).double()
    cnn(torch.randn(4, 3, 8, 8)).square().mean().backward()
    wide(torch.randn(5, 9, dtype=torch.float64)).sum().backward()
    params = [*cnn.parameters(), *wide.parameters()]
    return [*params, *(p.grad for p in params)]


def _stage(pairs, monkeypatch=None, native=True):
    state = _state()
    reducer = Reducer(len(pairs), HistogramDescriptor(), "auto", lambda: state)
    if not native:
        monkeypatch.setattr("stepscope.collect.staging.Staging._native_many", lambda *a, **k: None)
    reducer.reduce_many("parameter", pairs)
    spines, _ = host_copy(reducer.stagings, False)[CPU]
    return spines, reducer.stagings[CPU].fired.copy(), state


def test_the_one_call_path_writes_bit_for_bit_what_the_row_by_row_path_writes(monkeypatch):
    from stepscope.collect import staging as staging_mod

    tensors = _model_tensors()
    pairs = list(zip(_rows(len(tensors)), tensors))
    taken = []
    real = staging_mod.Staging._native_many
    monkeypatch.setattr(
        staging_mod.Staging,
        "_native_many",
        lambda self, rows, ts: taken.append(real(self, rows, ts)) or taken[-1],
    )
    fast, fired_fast, _ = _stage(pairs)
    assert taken == [()]  # the parameters and gradients of a real model take the one call
    monkeypatch.undo()
    slow, fired_slow, _ = _stage(pairs, monkeypatch, native=False)
    assert fast.tobytes() == slow.tobytes()  # every field of every row, bit for bit
    assert fired_fast.tolist() == fired_slow.tolist() == [1] * len(tensors)
    for k, t in enumerate(tensors):  # and both equal an independent float64 oracle
        got = dict(zip(SPINE_FIELDS, fast[k].tolist()))
        for name, want in _oracle(t).items():
            assert abs(got[name] - want) <= 1e-9 * max(1.0, abs(want)), (k, name)


def test_tensors_the_one_call_cannot_take_go_row_by_row_with_the_same_numbers(monkeypatch):
    torch.manual_seed(4)
    base = torch.randn(6, 5)
    cases = {
        "transposed": base.t(),  # not contiguous
        "half": torch.randn(9).half(),
        "negated view": torch.randn(4, dtype=torch.complex64).conj().imag,  # lazily negated
        "sparse": torch.randn(5).to_sparse(),
    }
    for name, odd in cases.items():
        pairs = list(zip(_rows(2), [torch.randn(7), odd]))
        state = _state()
        reducer = Reducer(2, HistogramDescriptor(), "auto", lambda state=state: state)
        reducer.reduce_many("parameter", pairs)
        spines, _ = host_copy(reducer.stagings, False)[CPU]
        assert reducer.stagings[CPU].fired.tolist() == [1, 1], name
        sparse = odd.layout is torch.sparse_coo  # its stored values are reduced (disclosed)
        want = _oracle(odd.coalesce().values() if sparse else odd)
        got = dict(zip(SPINE_FIELDS, spines[1].tolist()))
        for field, value in want.items():
            assert abs(got[field] - value) <= 1e-3 * max(1.0, abs(value)), (name, field)


def test_a_batch_with_odd_tensors_sends_only_those_the_general_way_with_the_same_bytes(
    monkeypatch,
):
    """A sparse embedding's gradient (or a half-precision or transposed tensor) among plain
    ones: the plain ones still take the one native call, only the odd ones go row by row,
    and every row's bytes equal the all-row-by-row path's."""
    from stepscope.collect import staging as staging_mod

    torch.manual_seed(6)
    emb = torch.nn.Embedding(11, 4, sparse=True)
    head = torch.nn.Linear(4, 3)
    head(emb(torch.tensor([1, 5, 5, 7]))).square().sum().backward()
    tensors = [
        head.weight.grad, emb.weight.grad, head.bias.grad, torch.randn(9).half(),
        head.weight, torch.randn(6, 5).t(), emb.weight,
    ]  # fmt: skip
    pairs = list(zip(_rows(len(tensors)), tensors))
    general: list[list[int]] = []
    real = staging_mod.Staging.write_many

    def spy(self, rows, ts, histogram):
        general.append(list(rows))
        return real(self, rows, ts, histogram)

    monkeypatch.setattr(staging_mod.Staging, "write_many", spy)
    mixed, fired_mixed, state = _stage(pairs)
    assert general == [[1, 3, 5]]  # only the sparse, half and transposed tensors
    assert state.row_notes == {1: "sparse_values"}
    general.clear()
    slow, fired_slow, _ = _stage(pairs, monkeypatch, native=False)
    assert general == [list(range(len(tensors)))]
    assert mixed.tobytes() == slow.tobytes()
    assert fired_mixed.tolist() == fired_slow.tolist() == [1] * len(tensors)


def test_a_row_already_written_this_step_folds_instead_of_being_overwritten():
    state = _state()
    reducer = Reducer(1, HistogramDescriptor(), "auto", lambda: state)
    row = _rows(1)[0]
    a, b = torch.arange(4.0), torch.arange(10.0, 13.0)
    reducer.reduce(row, a)  # e.g. a closure's gradient read earlier in the step
    reducer.reduce_many("parameter", [(row, b)])
    got = _spine(reducer, 0)
    assert reducer.stagings[CPU].fired.tolist() == [2]
    assert got["total"] == 7 and got["sum"] == float(a.sum() + b.sum()) and got["max"] == 12.0


# --------------------------------------------- the activation hooks' direct path to the kernel


def _recorded(case_name: str, monkeypatch, owner, name: str, on: bool, **watch) -> tuple:
    """Every step's batches of a real model (presence, spines, disclosures) as bytes, with the
    fast path ``owner.name`` on or off (off: it returns ``False``, the general path runs), and
    how often it wrote. ``watch``: the collector's streams and cadence."""
    from stepscope.collect import HistoryCollector, WatchSettings
    from tests.collect.models import CASES

    case = CASES[case_name]
    real = getattr(owner, name)
    taken: list[bool] = []

    def spy(self, *args):
        wrote = real(self, *args) if on else False
        taken.append(wrote)
        return wrote

    monkeypatch.setattr(owner, name, spy)
    torch.manual_seed(0)
    model = case.build()
    opt = case.optimizer(model)
    col = HistoryCollector(model, settings=WatchSettings(), **watch)
    g = torch.Generator().manual_seed(1)
    out = []
    try:
        for step in range(5):  # variable sequence lengths on the decoder
            with col.step(opt):
                opt.zero_grad()
                for _ in range(case.micro_batches):
                    x, y = case.batch(g, step)
                    case.loss(model(x), y).backward()
                opt.step()
            for b in col.last_batches:
                out.append(
                    str(b.stream).encode() + b.presence.tobytes() + b.spines.tobytes()
                    + repr(b.row_disclosures).encode()
                )  # fmt: skip
    finally:
        col.close()
    monkeypatch.undo()
    return out, sum(taken)


@pytest.mark.parametrize("model_name", ["gpt", "resnet"])
def test_activation_rows_through_the_direct_path_equal_the_general_path_bit_for_bit(
    model_name, monkeypatch
):
    from stepscope.collect import Cadence
    from stepscope.collect.staging import Staging

    watch = {"streams": ("activation", "activation_grad"), "cadence": Cadence(1, None)}
    direct, n_direct = _recorded(model_name, monkeypatch, Staging, "_native_one", True, **watch)
    general, n_general = _recorded(model_name, monkeypatch, Staging, "_native_one", False, **watch)
    assert n_direct > 0 and n_general == 0  # the direct path did write, then was switched off
    assert direct == general  # presence and every spine field, every step, bit for bit


def test_the_one_call_path_reads_each_calls_tensors_through_its_kept_row_plan():
    """The row list's arrays are kept between steps: each call still reads its own tensors
    (new gradients after ``zero_grad(set_to_none=True)``, a parameter whose ``.data`` was
    replaced by one of another dtype), a repeated row is refused every time (nothing
    written), and the kept plans stay bounded."""
    from stepscope.collect.staging import Staging

    torch.manual_seed(5)
    st = Staging(4, CPU, HistogramDescriptor())
    rows = [3, 1, 2]
    for k in range(3):
        ts = [torch.randn(5 + k), torch.randn(2, 3), torch.randn(4, dtype=torch.float64)]
        if k == 2:
            ts[0] = torch.nn.Parameter(torch.randn(6, dtype=torch.float64))
        st.reset()
        assert st._native_many(rows, ts) == ()  # every row written
        spines = st.spines.numpy()
        for r, t in zip(rows, ts):
            got = dict(zip(SPINE_FIELDS, spines[r].tolist()))
            for name, want in _oracle(t).items():
                assert abs(got[name] - want) <= 1e-9 * max(1.0, abs(want)), (k, r, name)
        assert st.fired.tolist() == [0, 1, 1, 1]
        assert st._native_many(rows, ts) is None  # fired this step: the general path folds them
    st.reset()
    for _ in range(2):
        assert st._native_many([0, 0], [torch.ones(2), torch.ones(3)]) is None
        assert st.fired.tolist() == [0, 0, 0, 0]
    wide = Staging(Staging.MAX_MANY_PLANS + 5, CPU, HistogramDescriptor())
    for k in range(Staging.MAX_MANY_PLANS + 5):  # a row list of its own each time
        assert wide._native_many([k], [torch.full((2,), float(k))]) == ()
        assert 0 < len(wide._many_plans) <= Staging.MAX_MANY_PLANS
    sums = wide.spines[:, SPINE_FIELDS.index("sum")].tolist()
    assert sums == [2.0 * k for k in range(Staging.MAX_MANY_PLANS + 5)]


@pytest.mark.parametrize("case_name", ["gpt", "resnet", "lstm", "model_output", "shared"])
def test_the_whole_hook_direct_path_records_what_the_general_hook_path_records(
    case_name, monkeypatch
):
    """Outputs that are plain tensors take :meth:`Reducer.direct` once their row is bound (a
    module called twice, a tuple or ModelOutput output, a histogram step take the general
    path); every row of every stream is the same, bit for bit, with it switched off."""
    fast, n_fast = _recorded(case_name, monkeypatch, Reducer, "direct", True, cadence=1)
    general, n_general = _recorded(case_name, monkeypatch, Reducer, "direct", False, cadence=1)
    assert n_fast > 0 and n_general == 0
    assert fast == general

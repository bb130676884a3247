"""``collect/reduce.py``: staged rows equal torch's own numbers; what cannot be reduced is
recorded (``unsupported`` / ``capture_failed``), never raised."""

from __future__ import annotations

import torch

from stepscope.collect.reduce import Reducer
from stepscope.collect.sites import Row
from stepscope.collect.stepstate import StepState
from stepscope.stats import SPINE_FIELDS, HistogramDescriptor

CPU = torch.device("cpu")


def _state(due: bool = True) -> StepState:
    return StepState(step=0, spine_due={"parameter": due}, hist_due={"parameter": False})


def _rows(n: int) -> list[Row]:
    module = torch.nn.Linear(1, 1)
    return [Row(i, "parameter", f"p{i}", "Linear", module) for i in range(n)]


def _spine(reducer: Reducer, row: int) -> dict[str, float]:
    spines, _ = reducer.to_host(False)[CPU]
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

    monkeypatch.setattr("stepscope.collect.staging.Staging.write_many", refuse)
    reducer.reduce_many("parameter", [(rows[0], good), (rows[1], other)])
    assert len(calls) == 1 and state.failed == {} and state.unsupported == {}
    for i, t in enumerate((good, other)):
        got = _spine(reducer, i)
        for k, v in _oracle(t).items():
            assert abs(got[k] - v) <= 1e-6 * max(1.0, abs(v)), (i, k)
    assert reducer.stagings[CPU].fired.tolist() == [1, 1]  # each row reduced once

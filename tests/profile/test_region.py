"""stepscope.region: inert without a session, a span plus a record_function bracket within one."""

from __future__ import annotations

import pytest
import torch

import stepscope as ss
from stepscope import Refusal
from stepscope.profile import Altitude, active_session, from_profiler


def test_region_outside_a_session_is_inert_even_under_a_raw_profiler():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with ss.region("quiet"):
            torch.ones(2).sum()
    names = {op.name for op in from_profiler(prof).join.ops}
    assert "aten::sum" in names
    assert not any(n.startswith("stepscope.") for n in names)
    assert active_session() is None


def test_decorator_records_each_call_and_nests_recursion():
    @ss.region("fib", kind="recursive")
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(5) == 5  # inert
    with ss.session() as s:
        assert fib(3) == 2
    spans = [sp for sp in s.result.spans if sp.altitude is Altitude.USER_REGION]
    assert len(spans) == 5  # fib(3), fib(2), fib(1), fib(0), fib(1)
    assert [sp.occurrence for sp in spans] == [0, 1, 2, 3, 4]
    assert spans[1].parent_id == spans[0].span_id and spans[2].parent_id == spans[1].span_id
    assert spans[4].parent_id == spans[0].span_id
    assert all(sp.metadata == {"kind": "recursive"} for sp in spans)
    assert fib.__name__ == "fib"


def test_exception_in_a_region_closes_span_and_bracket_and_propagates():
    with ss.session() as s:
        with pytest.raises(ValueError):
            with ss.region("fails"):
                torch.ones(2).sum()
                raise ValueError("x")
        torch.ones(1).add(1)
    (span,) = [sp for sp in s.result.spans if sp.name == "fails"]
    assert span.closed_by == "exit"
    by_event = {op.event: op for op in s.result.join.ops}

    def inside_region(name):
        (op,) = [o for o in by_event.values() if o.name == name and not _nested_same(by_event, o)]
        parent = op.parent
        while parent is not None:
            if by_event[parent].name == "stepscope.region/fails":
                return True
            parent = by_event[parent].parent
        return False

    assert inside_region("aten::sum")
    assert not inside_region("aten::add")  # the bracket closed before the add


def _nested_same(by_event, op):
    return op.parent is not None and by_event[op.parent].name == op.name


def test_same_region_object_can_be_reentered():
    r = ss.region("again")
    with ss.session() as s:
        with r:
            with r:
                pass
    spans = [sp for sp in s.result.spans if sp.name == "again"]
    assert len(spans) == 2 and spans[1].parent_id == spans[0].span_id
    assert all(sp.closed_by == "exit" for sp in spans)


def test_non_scalar_metadata_refuses():
    with pytest.raises(Refusal) as err:
        ss.region("bad", tensor=torch.ones(1))
    assert err.value.code == "span_metadata_invalid"


def test_region_names_are_escaped_in_spans_and_brackets():
    with ss.session() as s:
        with ss.region("two\nlines"):
            pass
    assert any(sp.name == "two\\nlines" for sp in s.result.spans)
    assert "stepscope.region/two\\nlines" in {op.name for op in s.result.join.ops}

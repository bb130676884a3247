"""SpanRegistry: registration at entry, parents per thread, boundary closes, name escaping."""

from __future__ import annotations

import threading
import time

import pytest

from stepscope import Refusal
from stepscope.profile.spans import (
    MAX_NAME_CHARS,
    Altitude,
    OwnerClass,
    SpanRegistry,
    check_scalar_metadata,
    escape_name,
)


def test_span_is_registered_open_at_entry_with_monotonic_times():
    reg = SpanRegistry()
    before = time.perf_counter_ns()
    span = reg.open("fwd", Altitude.USER_REGION, OwnerClass.USER)
    assert reg.spans == (span,) and reg.open_count == 1
    assert span.end_ns is None and span.duration_ns is None  # open: missing, not zero
    reg.close(span)
    after = time.perf_counter_ns()
    assert before <= span.start_ns <= span.end_ns <= after
    assert span.closed_by == "exit" and reg.open_count == 0


def test_parents_and_occurrences_follow_the_stack():
    reg = SpanRegistry()
    step = reg.open("step", Altitude.USER_REGION, OwnerClass.USER)
    first = reg.open("fwd", Altitude.USER_REGION, OwnerClass.USER)
    reg.close(first)
    second = reg.open("fwd", Altitude.USER_REGION, OwnerClass.USER)
    op = reg.open("fwd", Altitude.OP, OwnerClass.FRAMEWORK)  # same name, other altitude
    reg.close(op)
    reg.close(second)
    reg.close(step)
    assert (first.parent_id, second.parent_id, op.parent_id) == (0, 0, second.span_id)
    assert (first.occurrence, second.occurrence, op.occurrence) == (0, 1, 0)
    assert [s.span_id for s in reg.spans] == [0, 1, 2, 3]


def test_threads_have_their_own_parent_stacks():
    reg = SpanRegistry()
    outer = reg.open("main", Altitude.USER_REGION, OwnerClass.USER)
    seen = {}

    def worker():
        span = reg.open("worker", Altitude.USER_REGION, OwnerClass.USER)
        seen["parent"] = span.parent_id
        reg.close(span)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    reg.close(outer)
    assert seen["parent"] is None
    assert reg.spans[1].thread_id != outer.thread_id


def test_close_is_idempotent_and_closing_a_parent_discloses_open_children():
    reg = SpanRegistry()
    parent = reg.open("p", Altitude.USER_REGION, OwnerClass.USER)
    child = reg.open("c", Altitude.USER_REGION, OwnerClass.USER)
    reg.close(parent)
    reg.close(parent)
    assert parent.closed_by == "exit"
    assert child.closed_by == "parent 'p' closed first" and child.end_ns is not None
    assert reg.open_count == 0


def test_close_all_closes_leaked_spans_with_the_disclosure():
    reg = SpanRegistry()
    done = reg.open("done", Altitude.USER_REGION, OwnerClass.USER)
    reg.close(done)
    leaked = [reg.open(n, Altitude.USER_REGION, OwnerClass.USER) for n in ("a", "b")]
    closed = reg.close_all("session boundary")
    assert closed == leaked
    assert all(s.closed_by == "session boundary" and s.end_ns is not None for s in leaked)
    assert done.closed_by == "exit"
    fresh = reg.open("after", Altitude.USER_REGION, OwnerClass.USER)
    assert fresh.parent_id is None  # the stacks were reset with the boundary


@pytest.mark.parametrize(
    ("raw", "expected", "truncated"),
    [
        ("aten::mm", "aten::mm", False),
        ("a\nb\tc", "a\\nb\\tc", False),
        ("bell\x07", "bell\\x07", False),
        (12, "12", False),
    ],
)
def test_names_are_escaped(raw, expected, truncated):
    assert escape_name(raw) == (expected, truncated)


def test_long_names_are_bounded_with_a_marker():
    name, truncated = escape_name("n" * (MAX_NAME_CHARS + 1))
    assert truncated and len(name) == MAX_NAME_CHARS and name.endswith("...")
    reg = SpanRegistry()
    span = reg.open("\n" * 500, Altitude.USER_REGION, OwnerClass.USER)
    assert span.name_truncated and len(span.name) == MAX_NAME_CHARS


def test_metadata_must_be_scalar():
    assert check_scalar_metadata({"a": 1, "b": 0.5, "c": "x", "d": None, "e": True})
    with pytest.raises(Refusal) as err:
        check_scalar_metadata({"t": [1, 2]})
    assert err.value.code == "span_metadata_invalid" and err.value.remedies


def test_span_to_dict_names_altitude_and_owner():
    reg = SpanRegistry()
    span = reg.open("x", Altitude.GRAD_FN_FIRE, OwnerClass.STEPSCOPE_INTERNAL, {"k": 1})
    record = span.to_dict()
    assert record["altitude"] == "grad_fn_fire" and record["owner"] == "stepscope_internal"
    assert record["metadata"] == {"k": 1} and record["end_ns"] is None

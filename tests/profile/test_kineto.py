"""The join on synthetic event sets with hand-computed answers."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.profile.accounting import JoinStatus, classify_owner, interval_union_ns
from stepscope.profile.kineto import join_events
from stepscope.profile.results import Availability, availability_of
from stepscope.profile.spans import OwnerClass
from stepscope.profile.trace import TraceEvent, TraceEventKind

HOST = ("pid", 1)
OTHER_HOST = ("pid", 2)


class Builder:
    """Builds an event list; ``op``/``launch``/``kernel`` return the new event's index."""

    def __init__(self):
        self.events: list[TraceEvent] = []

    def add(self, kind, name, start, dur, thread, corr=None, ext=None):
        e = TraceEvent(len(self.events), kind, kind.value, name, start, dur, thread, corr, ext)
        self.events.append(e)
        return e.index

    def op(self, name, start, end, thread=HOST, ext=None):
        return self.add(TraceEventKind.CPU_OP, name, start, end - start, thread, ext=ext)

    def launch(self, corr, start, end, thread=HOST, ext=None):
        return self.add(
            TraceEventKind.RUNTIME, "cudaLaunchKernel", start, end - start, thread, corr, ext
        )

    def kernel(self, corr, start, dur, stream=7, device=0, kind=TraceEventKind.KERNEL, ext=None):
        return self.add(kind, f"k{corr}", start, dur, (device, stream), corr, ext)


def owners_by_name(result):
    """device event name -> owner op name, group names, or the residual status."""
    out = {}
    for a in result.device:
        name = result.events[a.event].name
        if a.owner is not None:
            out[name] = result.events[a.owner].name
        elif a.group is not None:
            out[name] = result.groups[a.group].names
        else:
            out[name] = a.status.value
    return out


def test_nesting_innermost_owner_and_inclusive_totals():
    b = Builder()
    a = b.op("A", 0, 100)
    b.op("B", 10, 50)
    b.op("C", 60, 90)
    b.launch(1, 20, 25)
    b.launch(2, 70, 72)
    b.launch(3, 95, 97)
    b.kernel(1, 200, 30)
    b.kernel(2, 240, 10)
    b.kernel(3, 260, 5)
    r = join_events(b.events)
    assert owners_by_name(r) == {"k1": "B", "k2": "C", "k3": "A"}
    ops = {o.name: o for o in r.ops}
    assert {n: o.device_self_ns for n, o in ops.items()} == {"A": 5, "B": 30, "C": 10}
    assert {n: o.device_total_ns for n, o in ops.items()} == {"A": 45, "B": 30, "C": 10}
    assert ops["A"].cpu_self_ns == 100 - 40 - 30 and ops["B"].parent == a
    assert ops["A"].launches == 1 and ops["B"].launches == 1
    acc = r.accounting
    assert (acc.device_time_sum_ns, acc.part_a_unique_ns, acc.joined_fraction) == (45, 45, 1.0)
    assert acc.residual_ns == {} and availability_of(r, True) is Availability.JOINED


def test_identical_intervals_form_one_ambiguous_group_counted_once():
    b = Builder()
    b.op("D", 0, 50)
    b.op("E", 0, 50)
    b.launch(1, 10, 12)
    b.kernel(1, 100, 20)
    b.kernel(1, 130, 7)  # a second kernel from the same launch (e.g. a graph launch)
    r = join_events(b.events)
    assert len(r.groups) == 1
    group = r.groups[0]
    assert set(group.names) == {"D", "E"} and group.device_ns == 27 and group.launches == 1
    assert all(o.device_self_ns == 0 and o.launches == 0 for o in r.ops)  # never split
    acc = r.accounting
    assert (acc.part_a_unique_ns, acc.part_a_ambiguous_ns, acc.joined_fraction) == (0, 27, 1.0)
    assert {a.status for a in r.device} == {JoinStatus.AMBIGUOUS}


def test_ops_overlapping_without_nesting_are_ambiguous_but_a_common_parent_is_not_a_candidate():
    b = Builder()
    b.op("P", 0, 200)
    b.op("F", 10, 60)
    b.op("G", 40, 100)  # overlaps F without nesting
    b.launch(1, 45, 50)  # inside both F and G
    b.launch(2, 70, 75)  # inside G only
    b.kernel(1, 300, 11)
    b.kernel(2, 320, 13)
    r = join_events(b.events)
    owners = owners_by_name(r)
    assert set(owners["k1"]) == {"F", "G"} and owners["k2"] == "G"
    assert {o.name: o.device_total_ns for o in r.ops}["P"] == 13  # unique launches only
    assert r.accounting.part_a_ambiguous_ns == 11 and r.accounting.part_a_unique_ns == 13


def test_overlapping_kernels_on_several_streams_and_devices_busy_is_the_union():
    b = Builder()
    b.op("A", 0, 100)
    for corr in range(1, 5):
        b.launch(corr, corr * 10, corr * 10 + 2)
    b.kernel(1, 0, 100, stream=1)
    b.kernel(2, 50, 100, stream=2)  # overlaps the first on another stream
    b.kernel(3, 200, 10, stream=3)
    b.kernel(4, 0, 10, stream=1, device=1)
    r = join_events(b.events)
    acc = r.accounting
    assert acc.device_time_sum_ns == 220
    assert acc.busy_ns_by_device == {0: 160, 1: 10} and acc.device_busy_ns == 170
    assert acc.part_a_unique_ns == 220  # per-op accounting sums durations


def test_missing_ids_missing_launches_collisions_and_orphans_are_named_residuals():
    b = Builder()
    b.op("A", 0, 100)
    b.launch(1, 10, 12)
    b.launch(3, 20, 22)
    b.launch(3, 30, 32)  # two runtime events claim correlation 3
    b.launch(4, 150, 152)  # no op encloses it
    b.launch(5, 40, 42, thread=OTHER_HOST)  # same times as A, but another thread
    b.kernel(1, 200, 10)
    b.kernel(None, 210, 20)
    b.kernel(2, 230, 30)  # no runtime event with correlation 2
    b.kernel(3, 260, 40)
    b.kernel(4, 300, 50)
    b.kernel(5, 350, 60)
    r = join_events(b.events)
    acc = r.accounting
    assert acc.part_a_unique_ns == 10
    assert acc.residual_ns == {
        "no_correlation_id": 20,
        "launch_not_found": 30,
        "launch_collision": 40,
        "no_enclosing_op": 50 + 60,
    }
    assert acc.joined_ns + sum(acc.residual_ns.values()) == acc.device_time_sum_ns == 210
    assert acc.joined_fraction == 10 / 210
    assert availability_of(r, True) is Availability.PARTIAL


def test_memcpy_and_memset_count_as_device_time():
    b = Builder()
    b.op("aten::copy_", 0, 100)
    b.launch(1, 10, 20)
    b.launch(2, 30, 40)
    b.kernel(1, 100, 8, kind=TraceEventKind.MEMCPY)
    b.kernel(2, 104, 8, kind=TraceEventKind.MEMSET)
    r = join_events(b.events)
    assert r.accounting.device_time_sum_ns == 16 and r.accounting.device_busy_ns == 12
    assert owners_by_name(r) == {"k1": "aten::copy_", "k2": "aten::copy_"}


def test_event_order_does_not_change_the_join():
    b = Builder()
    b.op("A", 0, 1000)
    for i in range(20):
        b.op(f"op{i}", 10 + 40 * i, 40 + 40 * i)
        b.launch(i + 1, 20 + 40 * i, 25 + 40 * i)
        b.kernel(i + 1, 5000 + 100 * i, 10 + i, stream=i % 3)
    expected = owners_by_name(join_events(b.events))
    assert expected == {f"k{i + 1}": f"op{i}" for i in range(20)}
    rng = random.Random(20260909)
    for _ in range(5):
        shuffled = list(b.events)
        rng.shuffle(shuffled)
        renumbered = [
            TraceEvent(
                i,
                e.kind,
                e.category,
                e.name,
                e.start_ns,
                e.dur_ns,
                e.thread,
                e.correlation,
                e.external_id,
            )
            for i, e in enumerate(shuffled)
        ]
        result = join_events(renumbered)
        assert owners_by_name(result) == expected
        assert result.accounting == join_events(b.events).accounting


def test_stepscope_internal_work_is_part_b_and_the_session_bracket_is_not_inherited():
    b = Builder()
    b.op("stepscope.session/0", 0, 1000)
    b.op("aten::mm", 10, 100)
    b.op("stepscope.internal/sync", 200, 400)
    b.op("aten::sum", 250, 300)  # our own reduction inside our bracket
    b.launch(1, 20, 30)
    b.launch(2, 260, 270)
    b.launch(3, 500, 510)  # directly in the session bracket
    b.kernel(1, 2000, 10)
    b.kernel(2, 2100, 20)
    b.kernel(3, 2200, 40)
    r = join_events(b.events)
    acc = r.accounting
    assert (acc.part_a_unique_ns, acc.part_b_internal_ns) == (10, 60)
    ops = {o.name: o for o in r.ops}
    assert not ops["aten::mm"].internal and ops["aten::sum"].internal
    assert ops["stepscope.session/0"].owner_class is OwnerClass.STEPSCOPE_INTERNAL


def test_ours_marks_overhead_events_without_inheritance():
    b = Builder()
    b.op("PythonDispatchMode", 0, 100)
    b.op("aten::mm", 10, 50)
    b.launch(1, 20, 30)
    b.kernel(1, 200, 10)
    r = join_events(b.events, ours=frozenset({"PythonDispatchMode"}))
    ops = {o.name: o for o in r.ops}
    assert ops["PythonDispatchMode"].internal and not ops["aten::mm"].internal
    assert r.accounting.part_a_unique_ns == 10


def test_external_id_is_only_a_cross_check():
    b = Builder()
    b.op("A", 0, 100, ext=11)
    b.op("B", 200, 300, ext=22)
    b.op("C", 400, 500, ext=33)
    b.launch(1, 10, 20, ext=11)  # agrees
    b.launch(2, 210, 220, ext=99)  # disagrees: the join still follows time, not the id
    b.launch(3, 410, 420, ext=3)  # 2023 format: External id equals its own correlation
    for corr in (1, 2, 3):
        b.kernel(corr, 1000 + corr * 10, 5, ext=corr)
    r = join_events(b.events)
    assert owners_by_name(r) == {"k1": "A", "k2": "B", "k3": "C"}
    cc = r.cross_check
    assert (cc.agree, cc.disagree, cc.unavailable) == (1, 1, 1)


def test_no_device_events_is_unavailable_or_empty_never_zero_fraction():
    b = Builder()
    b.op("aten::mm", 0, 10)
    r = join_events(b.events)
    assert r.accounting.joined_fraction is None
    assert availability_of(r, device_capable=False) is Availability.UNAVAILABLE
    assert availability_of(r, device_capable=True) is Availability.EMPTY
    assert availability_of(None, device_capable=True) is Availability.NOT_REQUESTED


def test_owner_classes_from_labels():
    assert classify_owner("aten::addmm") is OwnerClass.FRAMEWORK
    assert classify_owner("AddmmBackward0") is OwnerClass.FRAMEWORK
    assert classify_owner("ProfilerStep#3") is OwnerClass.FRAMEWORK
    assert classify_owner("stepscope.region/fwd") is OwnerClass.USER
    assert classify_owner("stepscope.internal/x") is OwnerClass.STEPSCOPE_INTERNAL
    assert classify_owner("## forward ##") is OwnerClass.EXTERNAL


def test_interval_union_matches_a_brute_force_count():
    rng = random.Random(7)
    for _ in range(50):
        iv = [(s, s + rng.randint(0, 30)) for s in (rng.randint(0, 100) for _ in range(12))]
        covered = {t for s, e in iv for t in range(s, e)}
        assert interval_union_ns(iv) == len(covered)


@st.composite
def nested_ops(draw):
    """Strictly nested, distinct op intervals (a random tree) plus launches placed inside."""
    intervals = []

    def build(start, end, depth):
        cursor = start + 1
        while cursor < end - 4 and depth < 4 and draw(st.booleans()):
            width = draw(st.integers(2, max(2, (end - cursor) // 2)))
            child = (cursor, min(cursor + width, end - 1))
            if child[1] - child[0] < 2:
                break
            intervals.append(child)
            build(child[0], child[1], depth + 1)
            cursor = child[1] + 1

    intervals.append((0, 10_000))
    build(0, 10_000, 0)
    launches = draw(st.lists(st.integers(0, 9_999), min_size=1, max_size=30))
    return intervals, launches


@settings(max_examples=60, deadline=None)
@given(nested_ops())
def test_sweep_matches_brute_force_innermost_containment(case):
    intervals, launch_starts = case
    b = Builder()
    for i, (s, e) in enumerate(intervals):
        b.op(f"op{i}", s, e)
    for corr, s in enumerate(launch_starts, start=1):
        b.launch(corr, s, s + 1)
        b.kernel(corr, 20_000 + corr, 1)
    got = owners_by_name(join_events(b.events))
    for corr, s in enumerate(launch_starts, start=1):
        containing = [i for i, (a, e) in enumerate(intervals) if a <= s and s + 1 <= e]
        innermost = max(containing, key=lambda i: (intervals[i][0], -intervals[i][1]))
        assert got[f"k{corr}"] == f"op{innermost}"


@settings(max_examples=40, deadline=None)
@given(nested_ops(), st.data())
def test_duplicated_innermost_intervals_form_exactly_that_group(case, data):
    intervals, launch_starts = case
    doubled = data.draw(st.sets(st.integers(0, len(intervals) - 1), max_size=len(intervals)))
    b = Builder()
    names: dict[tuple[int, int], list[str]] = {}
    for i, (s, e) in enumerate(intervals):
        copies = 2 if i in doubled else 1
        for c in range(copies):
            b.op(f"op{i}.{c}", s, e)
            names.setdefault((s, e), []).append(f"op{i}.{c}")
    for corr, s in enumerate(launch_starts, start=1):
        b.launch(corr, s, s + 1)
        b.kernel(corr, 20_000 + corr, 1)
    result = join_events(b.events)
    got = owners_by_name(result)
    for corr, s in enumerate(launch_starts, start=1):
        containing = [iv for iv in intervals if iv[0] <= s and s + 1 <= iv[1]]
        innermost = max(containing, key=lambda iv: (iv[0], -iv[1]))
        expected = names[innermost]
        owner = got[f"k{corr}"]
        assert (sorted(owner) if isinstance(owner, tuple) else [owner]) == sorted(expected)
    acc = result.accounting
    assert acc.joined_ns == acc.device_time_sum_ns == len(launch_starts)

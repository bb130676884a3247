"""The device-time join: device events -> their launch -> the innermost op around the launch.

The join uses runtime correlation ids and time containment only; names are display metadata.

1. Each device event (kernel, memcpy, memset) finds its **launch**: the runtime/driver event on
   a host thread with the same correlation id. A missing id, a missing launch or several runtime
   events claiming the id leave the device event **unjoined**, with a named reason.
2. Each launch finds its **owner**: the innermost host op on the launch's thread whose interval
   contains the launch. One sorted sweep per thread (``O(N log N)`` for the sort, stack depth per
   event after it) assigns every op its parent and every launch its owner. When the innermost
   op is not unique (identical intervals, or ops overlapping without nesting) the launch joins
   an **ambiguous group** of the candidates -- counted once, never split between them.
3. Device time is accounted in two parts plus a named residual: (a) time owned by user and
   framework ops (unique or ambiguous), (b) time owned by stepscope's own internal work (an op
   named ``stepscope.internal/...`` or anything inside one), and the residual by reason.
   Busy time is the interval union of device events, per device.

The External id is used only as a cross-check of the owner (traces from 2023 give a launch an
External id equal to its own correlation; those are not evidence either way).

Example
-------
>>> from stepscope.profile.trace import EventKind, TraceEvent
>>> def ev(i, kind, start, dur, thread, corr=None):
...     return TraceEvent(i, kind, kind.value, f"e{i}", start, dur, thread, corr, None)
>>> events = [
...     ev(0, EventKind.CPU_OP, 0, 100, ("p", 1)),
...     ev(1, EventKind.RUNTIME, 10, 5, ("p", 1), corr=7),
...     ev(2, EventKind.KERNEL, 50, 30, (0, 7), corr=7),
... ]
>>> result = join_events(events)
>>> result.device[0].owner, result.accounting.part_a_unique_ns, result.accounting.joined_fraction
(0, 30, 1.0)
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from stepscope.profile.spans import OwnerClass
from stepscope.profile.trace import DEVICE_KINDS, EventKind, TraceEvent

#: Label prefixes stepscope itself emits into the profiler.
INTERNAL_PREFIX = "stepscope.internal/"
REGION_PREFIX = "stepscope.region/"
SESSION_PREFIX = "stepscope.session/"  # ours, but what runs inside it is the user's work

_FRAMEWORK = re.compile(
    r"^(aten::|autograd::|torch::|torch\.|c10d::|nccl:|gloo:|cudnn|Optimizer\.|ProfilerStep#|"
    r"enumerate\(DataLoader\)|Torch-Compiled Region|triton_|record_param_comms|"
    r"[A-Za-z0-9_]+Backward\d*$)"
)


def classify_owner(name: str) -> OwnerClass:
    """Owner class of a profiled op, from the labels stepscope and torch emit.

    Examples
    --------
    >>> classify_owner("aten::mm").value, classify_owner("stepscope.internal/sync").value
    ('framework', 'stepscope_internal')
    """
    if name.startswith((INTERNAL_PREFIX, SESSION_PREFIX)):
        return OwnerClass.STEPSCOPE_INTERNAL
    if name.startswith(REGION_PREFIX):
        return OwnerClass.USER
    if _FRAMEWORK.match(name):
        return OwnerClass.FRAMEWORK
    return OwnerClass.EXTERNAL


class JoinStatus(str, Enum):
    """What happened to one device event in the join (the residual names)."""

    JOINED = "joined"
    AMBIGUOUS = "ambiguous"
    NO_CORRELATION = "no_correlation_id"
    LAUNCH_NOT_FOUND = "launch_not_found"
    LAUNCH_COLLISION = "launch_collision"
    NO_ENCLOSING_OP = "no_enclosing_op"


@dataclass(frozen=True)
class DeviceAttribution:
    """Where one device event's time went: its launch, and a unique owner or a group."""

    event: int
    status: JoinStatus
    launch: int | None = None
    owner: int | None = None
    group: int | None = None


@dataclass(frozen=True)
class OpRecord:
    """One host op with its CPU and joined device time (ns). ``event`` indexes the events."""

    event: int
    name: str
    owner_class: OwnerClass
    internal: bool  # stepscope's own work: charged to part (b), left out of per-op views
    parent: int | None
    thread: tuple
    start_ns: int
    dur_ns: int
    external_id: int | None
    cpu_self_ns: int
    device_self_ns: int
    device_total_ns: int
    launches: int


@dataclass(frozen=True)
class AmbiguousGroup:
    """Launches whose innermost owner is not unique: charged once, to the group."""

    group_id: int
    candidates: tuple[int, ...]
    names: tuple[str, ...]
    internal: bool
    device_ns: int
    launches: int


@dataclass(frozen=True)
class DeviceAccounting:
    """Two-part device-time accounting with a named residual (all ns, sums of durations).

    ``part_a_unique_ns + part_a_ambiguous_ns + part_b_internal_ns + sum(residual_ns.values())``
    equals ``device_time_sum_ns``. ``device_busy_ns`` is the per-device interval union (overlap
    across streams counted once). ``joined_fraction`` is ``None`` without device events.
    """

    device_event_count: int
    device_time_sum_ns: int
    device_busy_ns: int
    busy_ns_by_device: dict
    part_a_unique_ns: int
    part_a_ambiguous_ns: int
    part_b_internal_ns: int
    residual_ns: dict[str, int] = field(default_factory=dict)

    @property
    def joined_ns(self) -> int:
        """Device time joined to some op (parts a and b)."""
        return self.part_a_unique_ns + self.part_a_ambiguous_ns + self.part_b_internal_ns

    @property
    def joined_fraction(self) -> float | None:
        """``joined_ns / device_time_sum_ns``; ``None`` (not zero) when there is no device time."""
        if self.device_time_sum_ns == 0:
            return None
        return self.joined_ns / self.device_time_sum_ns


@dataclass(frozen=True)
class CrossCheck:
    """External-id agreement between a launch and its owner, for uniquely joined launches."""

    agree: int
    disagree: int
    unavailable: int


@dataclass(frozen=True)
class JoinResult:
    """Everything the join derived from one event set."""

    events: tuple[TraceEvent, ...]
    ops: tuple[OpRecord, ...]
    device: tuple[DeviceAttribution, ...]
    groups: tuple[AmbiguousGroup, ...]
    accounting: DeviceAccounting
    cross_check: CrossCheck


def interval_union_ns(intervals: Sequence[tuple[int, int]]) -> int:
    """Length of the union of half-open ``[start, end)`` intervals (ns).

    >>> interval_union_ns([(0, 10), (5, 20), (30, 40)])
    30
    """
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _contains(outer: TraceEvent, inner: TraceEvent) -> bool:
    return outer.start_ns <= inner.start_ns and inner.end_ns <= outer.end_ns


def _strictly_encloses(outer: TraceEvent, inner: TraceEvent) -> bool:
    return _contains(outer, inner) and (
        outer.start_ns != inner.start_ns or outer.end_ns != inner.end_ns
    )


def _sweep_thread(
    events: Sequence[TraceEvent], ops: list[int], launches: list[int]
) -> tuple[dict[int, int | None], dict[int, tuple[int, ...]]]:
    """One sweep over a thread: each op's parent, each launch's innermost candidate owners."""
    ops = sorted(ops, key=lambda i: (events[i].start_ns, -events[i].end_ns, i))
    launches = sorted(launches, key=lambda i: (events[i].start_ns, i))
    parents: dict[int, int | None] = {}
    owners: dict[int, tuple[int, ...]] = {}
    stack: list[int] = []
    k = 0

    def settle(at: int) -> None:
        while stack and events[stack[-1]].end_ns < at:
            stack.pop()

    for launch in launches:
        target = events[launch]
        while k < len(ops) and events[ops[k]].start_ns <= target.start_ns:
            op = events[ops[k]]
            settle(op.start_ns)
            parents[ops[k]] = next((s for s in reversed(stack) if _contains(events[s], op)), None)
            stack.append(ops[k])
            k += 1
        settle(target.start_ns)
        candidates: list[int] = []
        for s in reversed(stack):
            outer = events[s]
            if not _contains(outer, target):
                continue
            if candidates and all(_strictly_encloses(outer, events[c]) for c in candidates):
                break  # a common ancestor: the candidates above it are the innermost set
            candidates.append(s)
        owners[launch] = tuple(candidates)
    while k < len(ops):
        op = events[ops[k]]
        settle(op.start_ns)
        parents[ops[k]] = next((s for s in reversed(stack) if _contains(events[s], op)), None)
        stack.append(ops[k])
        k += 1
    return parents, owners


def join_events(events: Sequence[TraceEvent], ours: frozenset[str] = frozenset()) -> JoinResult:
    """Join device events to host ops by correlation id and same-thread containment.

    ``ours`` names further host events that are stepscope's own overhead (e.g. the
    ``PythonDispatchMode`` brackets torch adds while our ATen capture is on): their self time is
    ours, what runs inside them is not.
    """
    events = tuple(events)
    runtime_by_corr: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e.kind is EventKind.RUNTIME and e.correlation is not None:
            runtime_by_corr[e.correlation].append(e.index)
    device_ids = [e.index for e in events if e.kind in DEVICE_KINDS]

    launch_of: dict[int, int] = {}
    status: dict[int, JoinStatus] = {}
    for d in device_ids:
        corr = events[d].correlation
        found = runtime_by_corr.get(corr, []) if corr is not None else []
        if corr is None:
            status[d] = JoinStatus.NO_CORRELATION
        elif not found:
            status[d] = JoinStatus.LAUNCH_NOT_FOUND
        elif len(found) > 1:
            status[d] = JoinStatus.LAUNCH_COLLISION
        else:
            launch_of[d] = found[0]

    ops_by_thread: dict[tuple, list[int]] = defaultdict(list)
    for e in events:
        if e.kind is EventKind.CPU_OP:
            ops_by_thread[e.thread].append(e.index)
    launches_by_thread: dict[tuple, set[int]] = defaultdict(set)
    for launch in launch_of.values():
        launches_by_thread[events[launch].thread].add(launch)
    parents: dict[int, int | None] = {}
    owners: dict[int, tuple[int, ...]] = {}
    for thread in set(ops_by_thread) | set(launches_by_thread):
        p, o = _sweep_thread(
            events, ops_by_thread.get(thread, []), list(launches_by_thread[thread])
        )
        parents.update(p)
        owners.update(o)
    return _account(events, device_ids, launch_of, status, parents, owners, ours)


def _account(events, device_ids, launch_of, status, parents, owners, ours) -> JoinResult:
    op_ids = sorted(parents, key=lambda i: (events[i].start_ns, -events[i].end_ns, i))  # preorder
    owner_class = {
        i: OwnerClass.STEPSCOPE_INTERNAL
        if events[i].name in ours
        else classify_owner(events[i].name)
        for i in op_ids
    }
    internal: dict[int, bool] = {}
    for i in op_ids:
        parent = parents[i]
        inherited = internal.get(parent, False) if parent is not None else False
        internal[i] = inherited or events[i].name.startswith(INTERNAL_PREFIX)
    charged_b = {i: internal[i] or owner_class[i] is OwnerClass.STEPSCOPE_INTERNAL for i in op_ids}

    group_ids: dict[tuple[int, ...], int] = {}
    group_ns: dict[int, int] = defaultdict(int)
    group_launches: dict[int, set[int]] = defaultdict(set)
    device_self: dict[int, int] = defaultdict(int)
    op_launches: dict[int, set[int]] = defaultdict(set)
    attributions: list[DeviceAttribution] = []
    part_a_unique = part_a_ambiguous = part_b = 0
    residual: dict[str, int] = defaultdict(int)
    agree = disagree = unavailable = 0
    for d in device_ids:
        dur = events[d].dur_ns
        launch = launch_of.get(d)
        if launch is None:
            attributions.append(DeviceAttribution(d, status[d]))
            residual[status[d].value] += dur
            continue
        candidates = owners.get(launch, ())
        if not candidates:
            attributions.append(DeviceAttribution(d, JoinStatus.NO_ENCLOSING_OP, launch))
            residual[JoinStatus.NO_ENCLOSING_OP.value] += dur
        elif len(candidates) == 1:
            owner = candidates[0]
            attributions.append(DeviceAttribution(d, JoinStatus.JOINED, launch, owner=owner))
            device_self[owner] += dur
            op_launches[owner].add(launch)
            if charged_b[owner]:
                part_b += dur
            else:
                part_a_unique += dur
            lext, oext = events[launch].external_id, events[owner].external_id
            if lext is None or oext is None or lext == events[launch].correlation:
                unavailable += 1
            elif lext == oext:
                agree += 1
            else:
                disagree += 1
        else:
            key = tuple(sorted(candidates))
            gid = group_ids.setdefault(key, len(group_ids))
            attributions.append(DeviceAttribution(d, JoinStatus.AMBIGUOUS, launch, group=gid))
            group_ns[gid] += dur
            group_launches[gid].add(launch)
            if all(charged_b[c] for c in key):
                part_b += dur
            else:
                part_a_ambiguous += dur

    device_total = dict(device_self)
    for i in reversed(op_ids):  # children follow parents in preorder: fold totals upwards
        parent = parents[i]
        if parent is not None and device_total.get(i):
            device_total[parent] = device_total.get(parent, 0) + device_total[i]
    child_cpu: dict[int, int] = defaultdict(int)
    for i in op_ids:
        if parents[i] is not None:
            child_cpu[parents[i]] += events[i].dur_ns
    ops = tuple(
        OpRecord(
            event=i,
            name=events[i].name,
            owner_class=owner_class[i],
            internal=charged_b[i],
            parent=parents[i],
            thread=events[i].thread,
            start_ns=events[i].start_ns,
            dur_ns=events[i].dur_ns,
            external_id=events[i].external_id,
            cpu_self_ns=max(events[i].dur_ns - child_cpu[i], 0),
            device_self_ns=device_self.get(i, 0),
            device_total_ns=device_total.get(i, 0),
            launches=len(op_launches.get(i, ())),
        )
        for i in sorted(op_ids)
    )
    groups = tuple(
        AmbiguousGroup(
            group_id=gid,
            candidates=key,
            names=tuple(events[c].name for c in key),
            internal=all(charged_b[c] for c in key),
            device_ns=group_ns[gid],
            launches=len(group_launches[gid]),
        )
        for key, gid in group_ids.items()
    )
    by_device: dict[object, list[tuple[int, int]]] = defaultdict(list)
    for d in device_ids:
        by_device[events[d].thread[0]].append((events[d].start_ns, events[d].end_ns))
    busy = {dev: interval_union_ns(iv) for dev, iv in by_device.items()}
    accounting = DeviceAccounting(
        device_event_count=len(device_ids),
        device_time_sum_ns=sum(events[d].dur_ns for d in device_ids),
        device_busy_ns=sum(busy.values()),
        busy_ns_by_device=busy,
        part_a_unique_ns=part_a_unique,
        part_a_ambiguous_ns=part_a_ambiguous,
        part_b_internal_ns=part_b,
        residual_ns=dict(residual),
    )
    return JoinResult(
        events=events,
        ops=ops,
        device=tuple(attributions),
        groups=groups,
        accounting=accounting,
        cross_check=CrossCheck(agree, disagree, unavailable),
    )

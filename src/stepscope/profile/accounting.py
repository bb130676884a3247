"""Join records and the two-part device-time accounting.

The sweep in :mod:`stepscope.profile.kineto` decides, for every device event, its launch and its
owner candidates; this module turns those decisions into records and sums:

* :class:`OpRecord` per host op (CPU self time, device self/inclusive time, launches),
* :class:`AmbiguousGroup` per set of equally-innermost owners (charged once, never split),
* :class:`DeviceAccounting`: part (a) user/framework ops, part (b) stepscope's own work, and the
  residual by :class:`JoinStatus` name; busy time as the per-device interval union,
* :class:`CrossCheck`: External-id agreement, never used to decide an owner.

Owner classes come from the labels stepscope and torch emit (:func:`classify_owner`).

Example
-------
>>> interval_union_ns([(0, 10), (5, 20), (30, 40)])
30
>>> classify_owner("stepscope.region/fwd").value
'user'
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from stepscope.profile.spans import OwnerClass
from stepscope.profile.trace import TraceEvent
from stepscope.transfer import INTERNAL_PREFIX

#: Label prefixes stepscope itself emits into the profiler.
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
    total, cur_start = 0, 0
    cur_end: int | None = None
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


def account(
    events: Sequence[TraceEvent],
    device_ids: Sequence[int],
    launch_of: Mapping[int, int],
    status: Mapping[int, JoinStatus],
    parents: Mapping[int, int | None],
    owners: Mapping[int, tuple[int, ...]],
    ours: frozenset[str] = frozenset(),
) -> JoinResult:
    """Records and sums from the sweep's decisions (indices refer to ``events``).

    ``launch_of`` maps joinable device events to their launch, ``status`` names why the others
    are not joinable, ``parents`` gives every host op its enclosing op, ``owners`` every launch
    its innermost candidate owners, and ``ours`` names extra stepscope-overhead host events.
    """
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
        parent = parents[i]
        if parent is not None:
            child_cpu[parent] += events[i].dur_ns
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
        events=tuple(events),
        ops=ops,
        device=tuple(attributions),
        groups=groups,
        accounting=accounting,
        cross_check=CrossCheck(agree, disagree, unavailable),
    )

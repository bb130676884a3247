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
3. Device time is accounted (:mod:`stepscope.profile.accounting`) in two parts plus a named
   residual: (a) time owned by user and framework ops (unique or ambiguous), (b) time owned by
   stepscope's own work (an op named ``stepscope.internal/...`` or anything inside one), and the
   residual by reason. Busy time is the interval union of device events, per device.

The External id is used only as a cross-check of the owner (traces from 2023 give a launch an
External id equal to its own correlation; those are not evidence either way).

Example
-------
>>> from stepscope.profile.trace import TraceEventKind, TraceEvent
>>> def ev(i, kind, start, dur, thread, corr=None):
...     return TraceEvent(i, kind, kind.value, f"e{i}", start, dur, thread, corr, None)
>>> events = [
...     ev(0, TraceEventKind.CPU_OP, 0, 100, ("p", 1)),
...     ev(1, TraceEventKind.RUNTIME, 10, 5, ("p", 1), corr=7),
...     ev(2, TraceEventKind.KERNEL, 50, 30, (0, 7), corr=7),
... ]
>>> result = join_events(events)
>>> result.device[0].owner, result.accounting.part_a_unique_ns, result.accounting.joined_fraction
(0, 30, 1.0)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from stepscope.profile.accounting import JoinResult, JoinStatus, account
from stepscope.profile.trace import DEVICE_KINDS, TraceEvent, TraceEventKind


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

    Parameters
    ----------
    events
        Normalised events; ``events[i].index`` must equal ``i``.
    ours
        Further host event names that are stepscope's own overhead (e.g. the
        ``PythonDispatchMode`` brackets torch adds while our ATen capture is on): their self time
        is ours, what runs inside them is not.

    Returns
    -------
    JoinResult
        Per-op records, per-device-event attributions, ambiguous groups, the two-part accounting
        with its named residual, and the External-id cross-check.

    Examples
    --------
    >>> from stepscope.profile.trace import TraceEventKind, TraceEvent
    >>> ops = [TraceEvent(i, TraceEventKind.CPU_OP, "cpu_op", n, 0, 10, ("p", 1), None, None)
    ...        for i, n in enumerate(["a", "b"])]  # two ops with the same interval
    >>> launch = TraceEvent(2, TraceEventKind.RUNTIME, "cuda_runtime", "launch", 1, 1, ("p", 1), 5, None)
    >>> kernel = TraceEvent(3, TraceEventKind.KERNEL, "kernel", "k", 50, 4, (0, 7), 5, None)
    >>> r = join_events([*ops, launch, kernel])
    >>> r.groups[0].names, r.groups[0].device_ns, r.accounting.part_a_ambiguous_ns
    (('a', 'b'), 4, 4)
    """
    events = tuple(events)
    runtime_by_corr: dict[int, list[int]] = defaultdict(list)
    for e in events:
        if e.kind is TraceEventKind.RUNTIME and e.correlation is not None:
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
        if e.kind is TraceEventKind.CPU_OP:
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
    return account(events, device_ids, launch_of, status, parents, owners, ours)

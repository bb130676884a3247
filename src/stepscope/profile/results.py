"""What a profiling session or a loaded trace returns, and the views over it.

:class:`ProfileResult` carries the join (:mod:`stepscope.profile.kineto`), the availability of
device time on a five-state lattice, the spans recorded on stepscope's own clock, and the path
the events came by. Views: :meth:`ProfileResult.hot_path`, :meth:`ProfileResult.table` and
:meth:`ProfileResult.export_chrome_trace` (the trace plus an exact id-mapping sidecar).

Device-time views refuse ``device_time_unavailable`` unless device events were joined
(availability ``partial`` or ``joined``); CPU-time views work whenever events were captured.

Example
-------
>>> from stepscope.profile.results import Availability
>>> [a.value for a in Availability]
['not_requested', 'unavailable', 'empty', 'partial', 'joined']
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from stepscope.errors import Refusal
from stepscope.profile.accounting import JoinResult, JoinStatus
from stepscope.profile.spans import OwnerClass, Span

SIDECAR_SCHEMA = "stepscope.kineto_ids.v1"
VIEW_KEYS = ("device_time", "cpu_time")


class Availability(str, Enum):
    """Device-time availability: the closed five-state lattice."""

    NOT_REQUESTED = "not_requested"  # device time was not asked for
    UNAVAILABLE = "unavailable"  # no device activity could be recorded (e.g. CPU-only build)
    EMPTY = "empty"  # device activity was recorded but no device event happened
    PARTIAL = "partial"  # device events exist, some are unjoined (see the residual)
    JOINED = "joined"  # every device event joined to an op or an ambiguous group


def availability_of(join: JoinResult | None, device_capable: bool) -> Availability:
    """Place a join on the lattice."""
    if join is None:
        return Availability.NOT_REQUESTED
    acc = join.accounting
    if acc.device_event_count == 0:
        return Availability.EMPTY if device_capable else Availability.UNAVAILABLE
    return Availability.JOINED if not acc.residual_ns else Availability.PARTIAL


@dataclass(frozen=True)
class HotPathRow:
    """One row of a hot path: ops aggregated by name (times in ns).

    ``calls`` counts every profiler event of that name (``key_averages`` instead merges a lone
    same-name child into its parent, e.g. ``aten::mean`` inside ``aten::mean``); totals count
    each nest of same-name events once, so they are never double-counted.

    ``share`` is the row's value of the ranking metric over the whole (device time: the sum of
    all device event durations, residual included; CPU time: all non-internal CPU self time).
    Device fields are ``None`` when device time is not available -- never zero.
    """

    key: str
    owner_class: OwnerClass | None
    calls: int
    cpu_self_ns: int
    cpu_total_ns: int
    device_self_ns: int | None
    device_total_ns: int | None
    launches: int | None
    share: float


@dataclass(frozen=True)
class ProfileResult:
    """Joined profiler events, their availability, spans and provenance."""

    join: JoinResult | None
    availability: Availability
    source: str
    disclosures: tuple[str, ...] = ()
    spans: tuple[Span, ...] = ()
    exporter: Callable[[Path], None] | None = None

    def _require_events(self) -> JoinResult:
        if self.join is None:
            raise Refusal(
                "profiler_session_inactive",
                "this result holds no profiler events (a borrowed session leaves reading them "
                "to the profiler's owner).",
                ["after your profiler stops, call stepscope.profile.from_profiler(prof)"],
            )
        return self.join

    def require_device_time(self) -> JoinResult:
        """The join, or refuse ``device_time_unavailable`` when no device event was joined."""
        join = self._require_events()
        if self.availability not in (Availability.PARTIAL, Availability.JOINED):
            raise Refusal(
                "device_time_unavailable",
                f"device time is {self.availability.value} for this profile ({self.source}): "
                "no device events could be joined to ops.",
                [
                    "profile on a CUDA/ROCm build with a device tensor workload",
                    'use by="cpu_time" for host-side views',
                ],
            )
        return join

    def hot_path(self, by: str = "device_time", top: int = 10) -> list[HotPathRow]:
        """Ops aggregated by name, ranked by ``by`` (``device_time`` or ``cpu_time``) self time.

        stepscope's own work is left out (it is part (b) of the accounting); launches in an
        ambiguous group appear once, as a row keyed ``ambiguous{a | b}``.

        Examples
        --------
        >>> import torch, stepscope as ss
        >>> result = ss.kernel_profile(torch.nn.Linear(8, 8), torch.randn(4, 8))
        >>> result.hot_path(by="cpu_time", top=1)[0].calls >= 1
        True
        """
        if by not in VIEW_KEYS:
            raise Refusal(
                "profile_view_invalid", f"by={by!r} is not one of {VIEW_KEYS}.", [VIEW_KEYS[0]]
            )
        if not isinstance(top, int) or top < 1:
            raise Refusal("profile_view_invalid", f"top={top!r} is not a positive integer.", [])
        device = by == "device_time"
        join = self.require_device_time() if device else self._require_events()
        has_device = self.availability in (Availability.PARTIAL, Availability.JOINED)
        by_event = {op.event: op for op in join.ops}

        def outermost(op) -> bool:  # totals count a name once per nest (aten::mean in mean)
            parent = op.parent
            while parent is not None:
                if by_event[parent].name == op.name:
                    return False
                parent = by_event[parent].parent
            return True

        rows: dict[str, list] = {}
        for op in join.ops:
            if op.internal:
                continue
            row = rows.setdefault(op.name, [op.owner_class, 0, 0, 0, 0, 0, 0])
            row[1] += 1
            row[2] += op.cpu_self_ns
            row[4] += op.device_self_ns
            row[6] += op.launches
            if outermost(op):
                row[3] += op.dur_ns
                row[5] += op.device_total_ns
        for group in join.groups:
            if not group.internal:
                key = "ambiguous{" + " | ".join(group.names) + "}"
                row = rows.setdefault(key, [None, 0, 0, 0, 0, 0, 0])
                row[1] += 1
                row[4] += group.device_ns
                row[5] += group.device_ns
                row[6] += group.launches
        metric = 4 if device else 2
        whole = join.accounting.device_time_sum_ns if device else sum(r[2] for r in rows.values())
        ranked = sorted(rows.items(), key=lambda kv: (-kv[1][metric], kv[0]))
        out = []
        for key, (owner, calls, cself, ctotal, dself, dtotal, launches) in ranked:
            if device and dself == 0:
                continue
            value = dself if device else cself
            out.append(
                HotPathRow(
                    key=key,
                    owner_class=owner,
                    calls=calls,
                    cpu_self_ns=cself,
                    cpu_total_ns=ctotal,
                    device_self_ns=dself if has_device else None,
                    device_total_ns=dtotal if has_device else None,
                    launches=launches if has_device else None,
                    share=value / whole if whole else 0.0,
                )
            )
            if len(out) == top:
                break
        return out

    def table(self, by: str = "cpu_time", top: int = 20) -> str:
        """A fixed-width profile table with CPU and device columns (device ``n/a`` if missing).

        Columns: op, calls, CPU self/total and device self/total in microseconds, and the share
        of the ranking metric; the accounting summary follows the rows.

        Examples
        --------
        >>> import torch, stepscope as ss
        >>> r = ss.kernel_profile(torch.nn.Linear(4, 2), torch.randn(3, 4))
        >>> print(r.table(by="cpu_time", top=2))  # op names and timings differ by machine
        op...calls  cpu self us cpu total us  dev self us dev total us...share
        aten::...
        ...
        """
        rows = self.hot_path(by=by, top=top)

        def us(ns: int | None) -> str:
            return "n/a" if ns is None else f"{ns / 1000:.1f}"

        lines = [
            f"{'op':<48} {'calls':>6} {'cpu self us':>12} {'cpu total us':>12} "
            f"{'dev self us':>12} {'dev total us':>12} {'share':>7}"
        ]
        for r in rows:
            name = r.key if len(r.key) <= 48 else r.key[:45] + "..."
            lines.append(
                f"{name:<48} {r.calls:>6} {us(r.cpu_self_ns):>12} {us(r.cpu_total_ns):>12} "
                f"{us(r.device_self_ns):>12} {us(r.device_total_ns):>12} {r.share:>7.1%}"
            )
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        """One paragraph: availability, source, accounting and residual by name."""
        parts = [f"device time: {self.availability.value}; events from {self.source}"]
        if self.join is not None and self.join.accounting.device_event_count:
            acc = self.join.accounting
            parts.append(
                f"device sum {acc.device_time_sum_ns / 1000:.1f} us, busy "
                f"{acc.device_busy_ns / 1000:.1f} us; (a) ops {acc.part_a_unique_ns / 1000:.1f} us"
                f" + ambiguous {acc.part_a_ambiguous_ns / 1000:.1f} us, (b) stepscope internal "
                f"{acc.part_b_internal_ns / 1000:.1f} us, joined {acc.joined_fraction:.2%}; "
                f"residual { ({k: v / 1000 for k, v in acc.residual_ns.items()} or 'none') }"
            )
        parts.extend(self.disclosures)
        return "\n".join(parts)

    def id_mapping(self) -> dict:
        """The exact id mapping: each device event -> its launch -> its owner op (or group).

        Events are named by the ids the trace itself carries (``correlation`` on device and
        runtime events, ``external_id`` on ops) plus thread and start time in ns.

        Examples
        --------
        >>> import torch, stepscope as ss
        >>> r = ss.kernel_profile(torch.nn.ReLU(), torch.randn(3))
        >>> m = r.id_mapping()
        >>> m["schema"], m["device_events"]  # no device events on a CPU-only build
        ('stepscope.kineto_ids.v1', [])
        """
        join = self._require_events()
        ev = join.events

        def ref(i: int | None) -> dict | None:
            if i is None:
                return None
            e = ev[i]
            return {
                "name": e.name,
                "correlation": e.correlation,
                "external_id": e.external_id,
                "thread": list(e.thread),
                "start_ns": e.start_ns,
            }

        device = []
        for a in join.device:
            entry: dict[str, Any] = {"event": ref(a.event), "status": a.status.value}
            entry["launch"] = ref(a.launch)
            entry["owner"] = ref(a.owner)
            entry["group"] = a.group
            device.append(entry)
        acc = join.accounting
        return {
            "schema": SIDECAR_SCHEMA,
            "source": self.source,
            "availability": self.availability.value,
            "disclosures": list(self.disclosures),
            "device_events": device,
            "groups": [
                {"group": g.group_id, "candidates": [ref(c) for c in g.candidates]}
                for g in join.groups
            ],
            "accounting": {
                "device_time_sum_ns": acc.device_time_sum_ns,
                "device_busy_ns": acc.device_busy_ns,
                "part_a_unique_ns": acc.part_a_unique_ns,
                "part_a_ambiguous_ns": acc.part_a_ambiguous_ns,
                "part_b_internal_ns": acc.part_b_internal_ns,
                "residual_ns": acc.residual_ns,
            },
            "cross_check": vars(join.cross_check),
            "unjoined_statuses": [s.value for s in JoinStatus if s.value in acc.residual_ns],
        }

    def export_chrome_trace(self, path: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write the chrome trace to ``path`` and the id mapping to ``<path>.ids.json``.

        Returns the two paths. Refuses ``profiler_session_inactive`` when the result has no
        trace to write (a borrowed session).

        Examples
        --------
        >>> import tempfile, torch, stepscope as ss
        >>> r = ss.kernel_profile(torch.nn.ReLU(), torch.randn(3))
        >>> trace, ids = r.export_chrome_trace(tempfile.mkdtemp() + "/relu.json")
        >>> ids.name
        'relu.json.ids.json'
        """
        path = Path(path)
        if self.exporter is None:
            raise Refusal(
                "profiler_session_inactive",
                "this result has no chrome trace to export.",
                ["export from the profiler that owns the events: prof.export_chrome_trace(path)"],
            )
        mapping = self.id_mapping()
        self.exporter(path)
        sidecar = path.with_name(path.name + ".ids.json")
        sidecar.write_text(json.dumps(mapping, indent=1, default=str))
        return path, sidecar

"""The measuring side of ``cadence="auto"``: time the warm-up steps, then decide.

:class:`WarmupMeter` collects per-step costs while the collector runs every spine, and at the
last warm-up step asks :func:`~stepscope.collect.autocadence.choose_stream_cadences` for the
cadences. The decision and its ``cadence/*`` scalar rows are returned to the collector.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepscope.collect.autocadence import AutoCadence, choose_stream_cadences
from stepscope.collect.settings import Cadence


class WarmupMeter:
    """Per-stream, shared and training seconds of the warm-up steps."""

    def __init__(self, auto: AutoCadence, streams: Sequence[str]) -> None:
        self.auto, self.streams = auto, list(streams)
        self.seen: dict[str, list[float]] = {"shared": [], "train": []}
        self.decision: dict[str, Any] | None = None
        self.cadences: dict[str, Cadence] | None = None

    def observe(
        self,
        step: int,
        step_seconds: float,
        telemetry_s: float,
        stream_s: dict[str, float],
        telemetry_total: float,
    ) -> dict[str, float]:
        """Record one warm-up step; at the last one choose (``cadence/*`` rows, else ``{}``).

        ``step_seconds`` is the step's wall time up to the boundary, ``telemetry_s`` the hook
        time inside it, ``stream_s`` the reduction seconds per stream and ``telemetry_total`` all
        telemetry of the step including the boundary's own work.
        """
        seen = self.seen
        if step > 0:  # step 0 pays discovery and kernel loading: not representative
            seen["train"].append(max(0.0, step_seconds - telemetry_s))
            seen["shared"].append(max(0.0, telemetry_total - sum(stream_s.values())))
            for s in self.streams:
                seen.setdefault(s, []).append(stream_s.get(s, 0.0))
        if step < self.auto.warmup - 1:
            return {}
        choice = choose_stream_cadences(
            {s: seen.get(s, []) for s in self.streams},
            seen["shared"],
            seen["train"],
            self.auto.target,
            self.auto.histogram_factor,
        )
        self.cadences = dict(choice.cadences)
        self.decision = {**choice.to_dict(), "decided_at_step": step}
        rows: dict[str, float] = {}
        for s, c in choice.cadences.items():
            rows[f"cadence/{s}/spine_every"] = float(c.spine)
            rows[f"cadence/{s}/histogram_every"] = float(c.histogram)
        if choice.expected_overhead is not None:
            rows["cadence/expected_overhead"] = choice.expected_overhead
        return rows

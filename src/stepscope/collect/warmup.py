"""The measuring side of ``cadence="auto"``: time the warm-up steps, then decide.

:class:`WarmupMeter` collects per-step costs while the collector runs the warm-up pattern of
:mod:`~stepscope.collect.autocadence` (histogram steps, spine steps, nothing-due steps), and at the
last warm-up step asks :func:`~stepscope.collect.autocadence.choose_stream_cadences` for the
cadences. The decision and its ``cadence/*`` scalar rows are returned to the collector.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from stepscope.collect.autocadence import (
    AutoCadence,
    CadenceChoice,
    _mean,
    choose_stream_cadences,
)
from stepscope.collect.settings import Cadence, Schedule


def _every(schedule: Schedule | None) -> float:
    """A decided period as a scalar row (the auto cadences are always whole step counts)."""
    if not isinstance(schedule, int):
        raise TypeError(f"auto cadence period {schedule!r} is not a step count")
    return float(schedule)


def hook_dispatch_seconds(calls: int = 2000, repeats: int = 3) -> float:
    """What torch's module call path adds for one Python forward hook, in seconds (measured).

    The collector's hooks time their own bodies; the dispatch around them (torch's slow call
    path once a module has hooks) is outside any timer, so it is measured once here on a
    private ``nn.Identity`` with and without a no-op hook (best of ``repeats``, CPU time of
    this thread, so that other processes' load does not count).
    """
    m, x = torch.nn.Identity(), torch.zeros(1)

    def best() -> float:
        out = []
        for _ in range(repeats):
            t0 = time.thread_time()
            for _ in range(calls):
                m(x)
            out.append(time.thread_time() - t0)
        return min(out) / calls

    bare = best()
    handle = m.register_forward_hook(lambda _m, _i, _o: None)
    try:
        hooked = best()
    finally:
        handle.remove()
    return max(0.0, hooked - bare)


class WarmupMeter:
    """Collects the warm-up steps' timings and turns them into :func:`choose_stream_cadences` inputs.

    The collector calls :meth:`record` once per step (before that step's own block is written;
    the write and commit of a step are therefore charged through the next step's ``carried_s``)
    and :meth:`decide` at the last warm-up step. Step 0 (discovery, kernel loading) is ignored.
    """

    def __init__(
        self,
        auto: AutoCadence,
        streams: Sequence[str],
        commit_policy: tuple[int, float | None] | None = None,
    ) -> None:
        self.auto, self.streams = auto, list(streams)
        self.steps: list[dict[str, Any]] = []
        self.decision: dict[str, Any] | None = None
        self.cadences: dict[str, Cadence] | None = None
        #: ``(commit_steps, commit_seconds)`` of the artifact (``None``: RAM only, no commits)
        self.commit_policy = commit_policy
        self.commit_s = 0.0  # one commit's seconds, measured at the last warm-up step
        self.dispatch_s = hook_dispatch_seconds()

    def observe(
        self,
        step: int,
        train_s: float,
        stream_s: Mapping[str, float],
        telemetry_s: float,
        carried_s: float,
        hook_s: float = 0.0,
        hook_calls: int = 0,
    ) -> dict[str, float]:
        """:meth:`record` one step; at the last warm-up step :meth:`decide` and return the
        ``cadence/*`` scalar rows of the decision (``{}`` before)."""
        self.record(step, train_s, stream_s, telemetry_s, carried_s, hook_s, hook_calls)
        if not self.done(step):
            return {}
        choice = self.decide()
        self.cadences = dict(choice.cadences)
        self.decision = {
            **choice.to_dict(),
            "decided_at_step": step,
            "commit_seconds": self.commit_s,  # one commit, spread into fixed_seconds
            "hook_dispatch_seconds": self.dispatch_s,  # per hook call, in fixed/shared seconds
        }
        rows: dict[str, float] = {}
        for s, c in choice.cadences.items():
            rows[f"cadence/{s}/spine_every"] = _every(c.spine)
            rows[f"cadence/{s}/histogram_every"] = _every(c.histogram)
        if choice.expected_overhead is not None:
            rows["cadence/expected_overhead"] = choice.expected_overhead
        return rows

    def record(
        self,
        step: int,
        train_s: float,
        stream_s: Mapping[str, float],
        telemetry_s: float,
        carried_s: float,
        hook_s: float = 0.0,
        hook_calls: int = 0,
    ) -> None:
        """One step: training seconds, per-stream seconds, all telemetry seconds of the step so
        far (``telemetry_s``, including ``carried_s``: the previous step's write and commit),
        and the hooks' own seconds beyond their reductions (``hook_s``, over ``hook_calls``
        calls, each also paying torch's measured dispatch). The hooks run inside the training
        window, so their seconds move from the training time to the step's own cost."""
        if self.steps:
            self.steps[-1]["own"] += carried_s  # the previous step's write, now known
        if step == 0:
            return
        hooks = max(0.0, hook_s) + hook_calls * self.dispatch_s
        streams = {s: stream_s.get(s, 0.0) for s in self.streams}
        self.steps.append(
            {
                "step": step,
                "train": max(0.0, train_s - hooks),
                "streams": streams,
                "own": max(0.0, telemetry_s - carried_s - sum(streams.values())) + hooks,
                "complete": False,
            }
        )
        if len(self.steps) > 1:
            self.steps[-2]["complete"] = True

    def done(self, step: int) -> bool:
        return step >= self.auto.warmup - 1

    def decide(self) -> CadenceChoice:
        """The choice from the recorded steps (see the module docstring)."""
        rec = self.steps
        done = [r for r in rec if r["complete"]]  # their own write is known
        phase = {k: [r for r in done if r["step"] % 4 == k] for k in range(4)}
        spine_steps = phase[1] + phase[2]
        fixed = [r["own"] for r in phase[3]]
        f = _mean(fixed)
        shared_spine = _mean([r["own"] for r in spine_steps])
        shared = [max(0.0, r["own"] - f) for r in spine_steps]
        c = {s: [r["streams"][s] for r in spine_steps] for s in self.streams}
        hist = None
        if phase[0] and spine_steps:
            n = len(self.streams)
            extra_shared = max(0.0, _mean([r["own"] for r in phase[0]]) - shared_spine) / n
            hist = {
                s: [max(0.0, r["streams"][s] - _mean(c[s])) + extra_shared for r in phase[0]]
                for s in self.streams
            }
        if not spine_steps:  # a warm-up too short for the pattern: every step counts as logged
            c = {s: [r["streams"][s] for r in rec] for s in self.streams}
            shared = [r["own"] for r in rec]
        commit = self.commit_per_step([r["train"] for r in rec], f)
        fixed = [x + commit for x in fixed] or [commit]
        return choose_stream_cadences(
            c,
            shared,
            [r["train"] for r in rec],
            self.auto.target,
            self.auto.histogram_factor,
            histogram_seconds=hist,
            fixed_seconds=fixed,
        )

    def commit_per_step(self, train: Sequence[float], fixed: float) -> float:
        """One measured commit spread over the steps between commits: every ``commit_steps``
        steps or ``commit_seconds`` of steps, whichever comes first (seconds per step)."""
        if self.commit_policy is None or not self.commit_s or not train:
            return 0.0
        steps, seconds = self.commit_policy
        step_s = sorted(train)[len(train) // 2] + fixed
        per_commit = float(steps)
        if seconds is not None and step_s > 0:
            per_commit = min(per_commit, seconds / step_s)
        return self.commit_s / max(1.0, per_commit)

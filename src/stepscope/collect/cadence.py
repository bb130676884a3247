"""Cadence: which streams are due at a step, chosen by hand or measured (auto cadence).

``cadence="auto"``: measure what each stream costs, then choose cadences under a budget.

During the first ``warmup`` steps the collector follows a fixed pattern of period 4 (step ``s``):
``s % 4 == 0`` spines and histograms of every stream, ``1`` and ``2`` spines only, ``3`` nothing
due, and times each stream's reductions, the shared per-step work (the host copy, the step block
and its write, the commit, events) and the training step itself (the transaction body minus the
telemetry and the hooks inside it). A :class:`WarmupMeter` turns those into what the steady state pays:

- ``F``: the fixed seconds every step pays even with nothing due (step block, write, clock;
  the hooks' own Python, timed inside them, plus torch's dispatch per hook call, measured once
  on a private module; one commit, timed at the last warm-up step and spread over the steps
  between commits: ``commit_steps`` or ``commit_seconds`` of steps, whichever is fewer),
- ``S``: the extra shared seconds of a step on which spines are due,
- ``c_s``: stream ``s``'s spine seconds, ``H_s``: the extra seconds of its histograms (plus its
  share of the histogram step's larger copy and write),
- ``T``: the training seconds of a step (median).

It then picks, per stream, the densest cadence whose share of the budget holds:

.. math::
    k_s = \\left\\lceil \frac{c_s + S/n + H_s / h}{(\tau T - F) / n} \right\rceil,
    \\qquad \text{expected overhead} = \frac{F + \\sum_s (c_s + S/n + H_s/h) / k_s}{T}

with ``n`` streams, ``tau`` the target fraction and histograms every ``h * k_s`` steps. Costs
are means (a steady state pays the mean, commit spikes included), training time the median.
Without measured histogram costs the rule assumes ``H_s = rho (c_s + S/n)`` with ``rho`` =
:data:`HISTOGRAM_COST_FACTOR`. The decision, its inputs and the expected overhead are recorded;
precision is never changed.

Example
-------
>>> d = choose_stream_cadences({"a": [0.001], "b": [0.003]}, [0.0], [0.1], target=0.05)
>>> d.cadences["a"].spine, d.cadences["b"].spine, round(d.expected_overhead, 4)
(1, 2, 0.0325)

The measuring side of ``cadence="auto"``: time the warm-up steps, then decide.

:class:`WarmupMeter` collects per-step costs while the collector runs the warm-up pattern of
:mod:`~stepscope.collect.cadence` (histogram steps, spine steps, nothing-due steps), and at the
last warm-up step asks :func:`~stepscope.collect.cadence.choose_stream_cadences` for the
cadences. The decision and its ``cadence/*`` scalar rows are returned to the collector.

Cadences are per stream and per kernel: a :class:`Cadence` says how often the spine and how often
the histogram is taken (every ``k``-th optimizer step, counting from step 0, or a predicate).

>>> resolve_cadence({"parameter": 10}, ("activation", "parameter"))["parameter"]
Cadence(spine=10, histogram=100)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from stepscope.budget import densest_cadence
from stepscope.collect.settings import ALL_STREAMS
from stepscope.errors import Refusal

# ------------------------------------------------------------------ (cadences)
Schedule = int | Callable[[int], bool]


@dataclass(frozen=True)
class Cadence:
    """How often each kernel runs for one stream.

    Parameters
    ----------
    spine
        Take the spine every ``spine`` optimizer steps (steps 0, k, 2k, ...) or when the
        predicate ``spine(step)`` is true.
    histogram
        The same for the histogram (``0`` or ``None``: never). A histogram step that is not a
        spine step still takes the spine (the histogram's ``num/sum`` come from it).
    """

    spine: Schedule = 1
    histogram: Schedule | None = 10

    def __post_init__(self) -> None:
        for name in ("spine", "histogram"):
            v = getattr(self, name)
            if v is None or callable(v):
                continue
            if (
                isinstance(v, bool)
                or not isinstance(v, int)
                or v < 0
                or (name == "spine" and v == 0)
            ):
                raise Refusal(
                    "cadence_invalid",
                    f"cadence {name}={v!r} must be a positive int (histogram: >= 0) or a predicate",
                    ["use Cadence(spine=1, histogram=10)"],
                )

    @staticmethod
    def _due(schedule: Schedule | None, step: int) -> bool:
        if schedule is None or schedule == 0:
            return False
        if callable(schedule):
            return bool(schedule(step))
        return step % schedule == 0

    def spine_due(self, step: int) -> bool:
        """Whether the spine is taken at ``step`` (histogram steps imply it)."""
        return self._due(self.spine, step) or self.histogram_due(step)

    def histogram_due(self, step: int) -> bool:
        """Whether the histogram is taken at ``step``."""
        return self._due(self.histogram, step)

    def describe(self) -> dict[str, Any]:
        """JSON-safe description for the run record."""

        def d(v: Schedule | None) -> Any:
            return getattr(v, "__name__", "predicate") if callable(v) else v

        return {"spine": d(self.spine), "histogram": d(self.histogram)}


#: Default cadences, chosen by measurement (README, ``benchmarks/overhead.py``): every stream's
#: spine every 10 steps (the same steps, so nine steps in ten copy nothing and write only their
#: step block), histograms every 100 steps. Activation spines every step cost 9-17% of a step
#: on the benchmark's GPT-like decoder and ResNet-like CNN (the spine kernel over every module
#: output, plus its hook Python), three times the 3% the defaults aim at; a telemetry plan that
#: keeps within 5% collects most scalars at evaluation boundaries anyway. Ask for denser rows with
#: ``cadence=`` (e.g. ``{"activation": 1}``) or let ``cadence="auto"`` spend a budget.
DEFAULT_CADENCE: dict[str, Cadence] = {
    "activation": Cadence(10, 100),
    "activation_grad": Cadence(10, 100),
    "gradient": Cadence(10, 100),
    "parameter": Cadence(10, 100),
    "update": Cadence(10, 100),
}


class DueTable:
    """Which streams' spines and histograms are due at a step, for a fixed set of cadences.

    With int cadences the pattern repeats every ``lcm`` of the periods, so each residue is
    computed once (at most :attr:`MAX_PERIOD` of them); a predicate cadence is asked at every
    step. :meth:`at` returns dicts equal to asking each :class:`Cadence`; with int cadences they
    are shared, read-only, between the steps of one residue (a quiet step builds nothing).

    >>> cadences = {"activation": Cadence(10, 100), "gradient": Cadence(5, 0)}
    >>> table = DueTable(cadences, ("activation", "gradient"))
    >>> due, due_after = table.at(105)
    >>> dict(due), dict(due_after), table.period
    ({'activation': False, 'gradient': True}, {'activation': False, 'gradient': False}, 100)
    """

    MAX_PERIOD = 4096

    def __init__(self, cadences: Mapping[str, Cadence], streams: Iterable[str]) -> None:
        self.cadences = tuple((s, cadences[s]) for s in streams)
        self.streams = tuple(s for s, _ in self.cadences)
        self.values = tuple(c for _, c in self.cadences)
        schedules = [v for _, c in self.cadences for v in (c.spine, c.histogram)]
        # a Cadence holds predicates, None or ints >= 0 (checked when it was made)
        periods = [v for v in schedules if isinstance(v, int) and v > 0]
        fixed = periods and not any(callable(v) for v in schedules)
        period = math.lcm(*periods) if fixed else 0
        self.period = period if 0 < period <= self.MAX_PERIOD else 0
        self._seen: dict[int, tuple[Mapping[str, bool], Mapping[str, bool]]] = {}

    def matches(self, cadences: Mapping[str, Cadence]) -> bool:
        """Whether this table answers for ``cadences`` (the same, or equal, cadences)."""
        return tuple(map(cadences.get, self.streams)) == self.values

    def _ask(self, step: int) -> tuple[Mapping[str, bool], Mapping[str, bool]]:
        spine = {s: c.spine_due(step) for s, c in self.cadences}
        hist = {s: c.histogram_due(step) for s, c in self.cadences}
        return MappingProxyType(spine), MappingProxyType(hist)

    def at(self, step: int) -> tuple[Mapping[str, bool], Mapping[str, bool]]:
        """``(spine_due, hist_due)`` by stream at ``step``."""
        if not self.period:
            return self._ask(step)
        seen = self._seen.get(step % self.period)
        if seen is None:
            seen = self._seen[step % self.period] = self._ask(step)
        return seen


def resolve_cadence(
    cadence: int | Cadence | Mapping[str, int | Cadence] | None, streams: Iterable[str]
) -> dict[str, Cadence]:
    """Turn the user's ``cadence=`` into one :class:`Cadence` per watched stream.

    An int ``k`` means spine every ``k`` steps and histogram every ``10*k``.
    """

    def one(v: int | Cadence) -> Cadence:
        if isinstance(v, Cadence):
            return v
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return Cadence(v, 10 * v)
        raise Refusal("cadence_invalid", f"cadence {v!r} is not a positive int or a Cadence")

    streams = list(streams)
    if cadence is None:
        return {s: DEFAULT_CADENCE[s] for s in streams}
    if isinstance(cadence, Mapping):
        unknown = set(cadence) - set(ALL_STREAMS)
        if unknown:
            raise Refusal(
                "stream_unknown",
                f"cadence names unknown streams {sorted(unknown)}",
                [f"use {ALL_STREAMS}"],
            )
        return {s: one(cadence[s]) if s in cadence else DEFAULT_CADENCE[s] for s in streams}
    c = one(cadence)
    return dict.fromkeys(streams, c)


# ------------------------------------------------------------------ (autocadence)
HISTOGRAM_COST_FACTOR = 3.0


@dataclass(frozen=True)
class AutoCadence:
    """Ask the collector to choose its cadences by measurement.

    Parameters
    ----------
    target
        Telemetry budget as a fraction of the training time (0.05 = 5%).
    warmup
        Steps measured with every spine on before deciding (>= 2).
    histogram_factor
        Histograms every ``histogram_factor`` x the chosen spine cadence.
    """

    target: float = 0.05
    warmup: int = 20
    histogram_factor: int = 10

    def __post_init__(self) -> None:
        if not (0 < self.target < 1) or self.warmup < 2 or self.histogram_factor < 1:
            raise Refusal(
                "cadence_invalid",
                f"AutoCadence needs 0 < target < 1, warmup >= 2, histogram_factor >= 1: {self}",
                ["use AutoCadence(target=0.05, warmup=20, histogram_factor=10)"],
            )

    def warmup_cadence(self) -> Cadence:
        """The measuring pattern: histograms at ``s % 4 == 0``, spines at 1 and 2, nothing at 3."""
        return Cadence(_warmup_spine, _warmup_histogram)


def _warmup_spine(step: int) -> bool:
    return step % 4 != 3


def _warmup_histogram(step: int) -> bool:
    return step % 4 == 0


#: Cap on a chosen cadence.
MAX_CADENCE = 10_000


@dataclass(frozen=True)
class CadenceChoice:
    """The chosen cadences and what they were chosen from (JSON-safe via :meth:`to_dict`)."""

    cadences: dict[str, Cadence]
    expected_overhead: float | None
    target: float
    training_seconds_median: float
    stream_seconds_median: dict[str, float]
    shared_seconds_median: float
    rule: str
    fixed_seconds: float = 0.0
    histogram_seconds: dict[str, float] | None = None
    measurements: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cadences": {s: c.describe() for s, c in self.cadences.items()},
            "expected_overhead": self.expected_overhead,
            "target": self.target,
            "training_seconds_median": self.training_seconds_median,
            "stream_seconds_median": self.stream_seconds_median,
            "shared_seconds_median": self.shared_seconds_median,
            "rule": self.rule,
            "fixed_seconds": self.fixed_seconds,
            "histogram_seconds": self.histogram_seconds,
            "histogram_cost_factor": None if self.histogram_seconds else HISTOGRAM_COST_FACTOR,
        }


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def choose_stream_cadences(
    stream_seconds: Mapping[str, Sequence[float]],
    shared_seconds: Sequence[float],
    training_seconds: Sequence[float],
    target: float = 0.05,
    histogram_factor: int = 10,
    *,
    histogram_seconds: Mapping[str, Sequence[float]] | None = None,
    fixed_seconds: Sequence[float] = (),
) -> CadenceChoice:
    """The densest per-stream cadences whose expected telemetry stays within ``target`` (pure).

    Parameters
    ----------
    stream_seconds
        Per stream, its spine seconds on measured logged steps (``c_s``: the mean is used).
    shared_seconds
        Extra shared seconds of a logged step (``S``), beyond the fixed cost.
    training_seconds
        Training seconds per step (``T``: the median is used).
    target, histogram_factor
        Budget fraction ``tau`` and ``h``.
    histogram_seconds
        Per stream, the extra seconds its histograms add to a step (``H_s``); default
        ``rho (c_s + S/n)`` with ``rho`` = :data:`HISTOGRAM_COST_FACTOR`.
    fixed_seconds
        Seconds every step pays with nothing due (``F``); default 0.

    Returns
    -------
    CadenceChoice
        With no usable training time (all zero) every stream keeps cadence 1 and the rule says
        so; when ``F`` alone exceeds the budget the streams share ``tau T`` as if ``F`` were free
        (rule ``fixed_cost_exceeds_budget``; the expected overhead then exceeds the target).
    """
    streams = list(stream_seconds)
    if not streams:
        raise Refusal("cadence_invalid", "no stream was measured", ["watch at least one stream"])
    mean = {s: _mean(v) for s, v in stream_seconds.items()}
    shared = _mean(shared_seconds)
    fixed = _mean(fixed_seconds)
    train = statistics.median(training_seconds) if training_seconds else 0.0
    n = len(streams)
    if train <= 0:
        cad = {s: Cadence(1, histogram_factor) for s in streams}
        return CadenceChoice(cad, None, target, train, mean, shared, "no_training_time_measured")
    if histogram_seconds is None:
        hist = {s: HISTOGRAM_COST_FACTOR * (mean[s] + shared / n) for s in streams}
    else:
        hist = {s: _mean(histogram_seconds.get(s, ())) for s in streams}
    budget = (target * train - fixed) / n
    rule = "equal_share_per_stream"
    if budget <= 0:  # no cadence can keep the promise: share the budget as if F were free, say so
        budget, rule = target * train / n, "fixed_cost_exceeds_budget"
    cadences, expected = {}, fixed
    for s in streams:
        cost = mean[s] + shared / n + hist[s] / histogram_factor
        k = min(MAX_CADENCE, densest_cadence(cost, budget))
        cadences[s] = Cadence(k, histogram_factor * k)
        expected += cost / k
    return CadenceChoice(
        cadences,
        expected / train,
        target,
        train,
        mean,
        shared,
        rule,
        fixed_seconds=fixed,
        histogram_seconds=None if histogram_seconds is None else hist,
    )


# ------------------------------------------------------------------ (warmup)
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

"""Choosing how often (or how large) to probe from measured costs, against an overhead target.

The overhead of probing every ``k`` optimizer steps is ``probe_seconds / (k * step_seconds)``, where
``probe_seconds`` is one measurement **plus its serialisation** (turning the record into rows and
writing them: the seed's 5% target is on "telemetry measurement plus serialization").
:func:`choose_cadence` picks the densest cadence (smallest ``k``) whose overhead stays at or under
the target (default 5%); :func:`choose_probe_size` keeps the cadence and picks the largest probe
size that fits. Both record the decision with the measurements behind it. Neither ever changes
precision: the dtype is recorded, not chosen.

Example
-------
>>> d = choose_cadence([0.30, 0.31, 0.29], [0.10, 0.11, 0.10], target=0.05)
>>> d.cadence_steps, round(d.expected_overhead, 3)
(60, 0.05)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from stepscope.budget import densest_cadence
from stepscope.probe.sink import probe_scalar_rows

if TYPE_CHECKING:
    from stepscope.probe.dense import DenseProbe

DEFAULT_TARGET = 0.05


@dataclass(frozen=True)
class CadenceDecision:
    """A cadence/size decision and the measurements it was made from.

    Attributes
    ----------
    cadence_steps
        Probe every this many optimizer steps; ``None`` if no candidate meets the target.
    probe_size
        Probe examples; ``None`` if no candidate size meets the target.
    expected_overhead
        ``median(probe_seconds) / (cadence_steps * median(step_seconds))`` (a fraction), or None.
    target_overhead
        The target fraction (0.05 = 5%).
    rule
        Which rule chose (``"densest_cadence"`` or ``"largest_probe"``) and why.
    """

    cadence_steps: int | None
    probe_size: int | None
    expected_overhead: float | None
    target_overhead: float
    probe_seconds_median: float | dict[int, float]
    step_seconds_median: float
    measurements: dict[str, Any]
    rule: str
    dtype: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (size-keyed mappings get string keys)."""
        out = dataclasses.asdict(self)
        if isinstance(self.probe_seconds_median, dict):
            out["probe_seconds_median"] = {str(k): v for k, v in self.probe_seconds_median.items()}
        return out


def _median(samples: Sequence[float]) -> float:
    values = [float(s) for s in samples]
    if not values or any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError("timings must be non-empty, finite and non-negative")
    return statistics.median(values)


def choose_cadence(
    probe_seconds: Sequence[float],
    step_seconds: Sequence[float],
    target: float = DEFAULT_TARGET,
    max_cadence: int | None = None,
    probe_size: int | None = None,
    dtype: str | None = None,
) -> CadenceDecision:
    """Densest cadence ``k >= 1`` with ``probe / (k * step) <= target``.

    Parameters
    ----------
    probe_seconds, step_seconds
        Measured wall times (seconds) of one probe measurement and one training step.
    target
        Overhead fraction not to exceed.
    max_cadence
        Largest acceptable ``k``; if the target needs more, ``cadence_steps`` is ``None``.
    """
    probe, step = _median(probe_seconds), _median(step_seconds)
    if step <= 0.0:
        raise ValueError("step time must be positive")
    k = densest_cadence(probe, target * step)
    feasible = max_cadence is None or k <= max_cadence
    return CadenceDecision(
        cadence_steps=k if feasible else None,
        probe_size=probe_size,
        expected_overhead=probe / (k * step) if feasible else None,
        target_overhead=target,
        probe_seconds_median=probe,
        step_seconds_median=step,
        measurements={"probe_seconds": list(probe_seconds), "step_seconds": list(step_seconds)},
        rule="densest_cadence" if feasible else f"infeasible: needs cadence {k} > {max_cadence}",
        dtype=dtype,
    )


def choose_probe_size(
    probe_seconds_by_size: Mapping[int, Sequence[float]],
    step_seconds: Sequence[float],
    cadence_steps: int,
    target: float = DEFAULT_TARGET,
    dtype: str | None = None,
) -> CadenceDecision:
    """Largest probe size whose overhead at a fixed cadence stays at or under ``target``."""
    step = _median(step_seconds)
    medians = {int(s): _median(t) for s, t in probe_seconds_by_size.items()}
    fitting = [s for s, t in medians.items() if t / (cadence_steps * step) <= target]
    size = max(fitting) if fitting else None
    return CadenceDecision(
        cadence_steps=cadence_steps if size is not None else None,
        probe_size=size,
        expected_overhead=medians[size] / (cadence_steps * step) if size is not None else None,
        target_overhead=target,
        probe_seconds_median=medians,
        step_seconds_median=step,
        measurements={
            "probe_seconds_by_size": {str(k): list(v) for k, v in probe_seconds_by_size.items()},
            "step_seconds": list(step_seconds),
        },
        rule="largest_probe" if size is not None else "infeasible: no size meets the target",
        dtype=dtype,
    )


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class ProbeTimings:
    """Alternating timings (seconds, after warm-up): training steps, measurements, serialisation."""

    step_seconds: list[float]
    measure_seconds: list[float]
    serialization_seconds: list[float]

    @property
    def probe_seconds(self) -> list[float]:
        """Measurement plus serialisation, per repeat (what a probe costs the run)."""
        return [m + s for m, s in zip(self.measure_seconds, self.serialization_seconds)]


def _rows_only(record: Any) -> Any:
    return probe_scalar_rows(record)


def time_probe_parts(
    probe: DenseProbe,
    model: torch.nn.Module,
    train_step: Callable[[], Any],
    repeats: int = 5,
    warmup: int = 1,
    serialize: Callable[[Any], Any] | None = None,
) -> ProbeTimings:
    """Time ``train_step()``, ``probe.measure`` and ``serialize(record)`` alternately.

    ``serialize`` writes a record the way the run will (default: convert it to its rows,
    :func:`~stepscope.probe.probe_scalar_rows`). The probe's own snapshots are left as they were.
    """
    device = next(model.parameters()).device
    saved = (probe.init_snapshot, probe.snapshot)
    write = serialize or _rows_only
    box: list[Any] = []

    def measure() -> None:
        box[:] = [probe.measure(model, step=0, examples_seen=0, epoch=0, resnapshot=False)]

    steps, measures, serials = [], [], []
    try:
        for i in range(warmup + repeats):
            t_step, t_probe = _timed(train_step, device), _timed(measure, device)
            t_serial = _timed(lambda: write(box[0]), device)
            if i >= warmup:
                steps.append(t_step)
                measures.append(t_probe)
                serials.append(t_serial)
    finally:
        probe.init_snapshot, probe.snapshot = saved
    return ProbeTimings(steps, measures, serials)


def time_probe(
    probe: DenseProbe,
    model: torch.nn.Module,
    train_step: Callable[[], Any],
    repeats: int = 5,
    warmup: int = 1,
    serialize: Callable[[Any], Any] | None = None,
) -> tuple[list[float], list[float]]:
    """``(probe_seconds, step_seconds)`` per repeat; probe seconds include serialisation.

    See :func:`time_probe_parts` (which keeps the two parts apart).
    """
    t = time_probe_parts(probe, model, train_step, repeats, warmup, serialize)
    return t.probe_seconds, t.step_seconds


def plan_cadence(
    probe: DenseProbe,
    model: torch.nn.Module,
    train_step: Callable[[], Any],
    target: float = DEFAULT_TARGET,
    repeats: int = 5,
    max_cadence: int | None = None,
    serialize: Callable[[Any], Any] | None = None,
) -> CadenceDecision:
    """Time the probe (measurement + serialisation) against real training steps and choose the
    densest cadence under ``target``.

    The decision records the probe size, the model dtype (never changed) and every timing, with
    the measurement and serialisation seconds apart.
    """
    t = time_probe_parts(probe, model, train_step, repeats=repeats, serialize=serialize)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    decision = choose_cadence(
        t.probe_seconds, t.step_seconds, target, max_cadence, probe.selection.size, dtype
    )
    parts = {"measure_seconds": t.measure_seconds, "serialization_seconds": t.serialization_seconds}
    return dataclasses.replace(decision, measurements={**decision.measurements, **parts})

"""The study's telemetry budget: the probe cadence it qualifies, the work it charges to telemetry
time, and each run's accounting record (``telemetry.json``).

Split from :mod:`stepscope.demo.study` along this seam: the study trains; this module decides how
often the probe may run (:func:`probe_cadence`, timed on a copy of the model), charges work done
outside the collector's hooks to ``collector.telemetry()`` (:class:`TelemetryLedger`,
:func:`probed_update`) and writes down where the telemetry seconds went (:func:`telemetry_record`).

Example
-------
>>> rec = telemetry_record({"training_seconds": 10.0, "telemetry_seconds": 0.4},
...                        {"probe_seconds": 0.1}, {"probe_seconds": 2}, evaluation_seconds=2.0)
>>> rec["overall_telemetry_fraction"], rec["hook_and_logging_seconds"]
(0.04, 0.30000000000000004)
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from stepscope._purity import preserved_state
from stepscope.history import HistoryWriter
from stepscope.probe import plan_cadence, write_probe_record

if TYPE_CHECKING:
    from stepscope.collect import HistoryCollector
    from stepscope.demo.data import DigitSplits
    from stepscope.demo.study import StudyConfig
    from stepscope.probe import DenseProbe

#: Each run's telemetry accounting file (:func:`telemetry_record`).
TELEMETRY_FILE = "telemetry.json"


def probe_cadence(
    cfg: StudyConfig,
    probe: DenseProbe,
    model: torch.nn.Module,
    splits: DigitSplits,
    steps_per_epoch: int,
) -> tuple[int, dict]:
    """The probe cadence: the user's, or the densest one the probe's helper qualifies (<= target).

    The helper times the probe against real training steps of a *copy* of the model (the run
    itself is untouched) and never changes precision; its decision and timings are recorded.
    """

    if cfg.probe_every is not None:
        return cfg.probe_every, {"rule": "user", "cadence_steps": cfg.probe_every}
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    x, y = splits.train_x[: cfg.batch_size], splits.train_y[: cfg.batch_size]

    def step() -> None:
        loss = F.cross_entropy(twin(x), y)
        twin_opt.zero_grad(set_to_none=True)
        loss.backward()
        twin_opt.step()

    with (
        preserved_state(twin),  # the twin's dropout/stochastic depth draws leave no trace
        tempfile.TemporaryDirectory() as scratch,
        HistoryWriter(Path(scratch) / "probe", durable=True) as writer,
    ):
        # serialisation is timed the way the run writes: rows into a durable artifact
        decision = plan_cadence(
            probe,
            twin,
            step,
            target=cfg.probe_overhead_target,
            repeats=3,
            max_cadence=None,
            serialize=lambda rec: write_probe_record(writer, rec),
        )
    record = decision.to_dict()
    every = decision.cadence_steps or steps_per_epoch  # infeasible: epoch ends only (recorded)
    return every, record


class TelemetryLedger:
    """Seconds of the telemetry done outside the collector's hooks, by kind.

    Every ``charge(kind)`` block runs inside ``collector.telemetry()`` (so the collector's
    telemetry clock includes it and the training clock does not) and is also added to
    ``seconds[kind]`` here, so the run record can say what the telemetry time was spent on.
    """

    def __init__(self, collector: HistoryCollector) -> None:
        self.collector = collector
        self.seconds: dict[str, float] = {
            "probe_seconds": 0.0,
            "probe_serialization_seconds": 0.0,
            "update_snapshot_seconds": 0.0,
            "checkpoint_seconds": 0.0,
        }
        self.counts: dict[str, int] = dict.fromkeys(self.seconds, 0)

    @contextmanager
    def charge(self, kind: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            with self.collector.telemetry():
                yield
        finally:
            self.seconds[kind] += time.perf_counter() - t0
            self.counts[kind] += 1


def telemetry_record(
    runlog: dict, ledger: dict[str, float], counts: dict[str, int], evaluation_seconds: float
) -> dict:
    """The run's telemetry accounting: what the collector's clocks say, and what was spent on.

    ``overall_telemetry_fraction`` = all telemetry seconds (hooks, probe, its serialisation,
    update snapshots, checkpoints) / isolated training seconds;
    ``fraction_of_training_and_evaluation`` divides by training plus the run's existing
    evaluation seconds (the seed's 5% target's denominator).
    """
    training = float(runlog.get("training_seconds") or 0.0)
    telemetry = float(runlog.get("telemetry_seconds") or 0.0)
    outside = sum(ledger.values())
    return {
        "training_seconds": training,
        "evaluation_seconds": evaluation_seconds,
        "telemetry_seconds": telemetry,
        **ledger,
        "hook_and_logging_seconds": max(telemetry - outside, 0.0),
        "counts": counts,
        "overall_telemetry_fraction": telemetry / training if training > 0 else None,
        "fraction_of_training_and_evaluation": telemetry / (training + evaluation_seconds)
        if training + evaluation_seconds > 0
        else None,
        "target_fraction": 0.05,
        "clock": "host perf_counter; probe, serialisation, snapshots and checkpoints charged "
        "through collector.telemetry(), never to training seconds",
    }


def probed_update(
    ledger: TelemetryLedger,
    probe: DenseProbe,
    model: torch.nn.Module,
    step: int,
    opt: torch.optim.Optimizer,
) -> None:
    """One optimizer step whose true update the probe records; only the snapshot is telemetry
    (the step itself stays inside the transaction, observed by the hooks)."""
    capture = probe.around_step(model, step=step, optimizer=opt)
    with ledger.charge("update_snapshot_seconds"):
        capture.__enter__()
    try:
        opt.step()
    except BaseException as exc:
        capture.__exit__(type(exc), exc, exc.__traceback__)
        raise
    with ledger.charge("update_snapshot_seconds"):
        capture.__exit__(None, None, None)

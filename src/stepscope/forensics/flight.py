"""The live flight recorder of one collector: read every step, check, save, go dense.

:class:`Flight` is what a :class:`~stepscope.HistoryCollector` holds when its settings carry a
:class:`~stepscope.forensics.FlightRecorder`. The collector calls

* :meth:`Flight.attach_optimizer` for every optimizer it watches (the reader's step hooks);
* :meth:`Flight.end_step` once a step is written (its readings join the window, the triggers
  check them, a trigger saves the window and schedules the dense steps);
* :meth:`Flight.dense_at` when a step begins (take every stream's spine at a dense step);
* :meth:`Flight.close` when it closes (hooks removed, the window written a last time).

What this does is described in :mod:`stepscope.forensics.recorder`. Nothing here raises into
the training step: a failure is warned about once and the recorder stops (its hooks return at
once), the collector carries on.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from stepscope.events.coordinates import Axes
from stepscope.events.event import VerdictEvent
from stepscope.events.payload import Verdict
from stepscope.forensics.archive import ForensicsFiles
from stepscope.forensics.attribution import Spike, spike_from_row
from stepscope.forensics.channels import Channel
from stepscope.forensics.detector import Crossing, LossSpike, StepReading, check_triggers
from stepscope.forensics.reading import SiteReader
from stepscope.forensics.recorder import FlightRecorder
from stepscope.forensics.window import FlightWindow

__all__ = ["Flight"]


class Flight:
    """One collector's flight recorder (see the module docstring).

    Parameters
    ----------
    config
        The :class:`FlightRecorder` settings.
    reader, channels
        The hooks reading the per-site scalars, and the window's columns.
    run_dir
        The artifact directory of this rank (``None``: RAM only, triggers kept in memory).
    rank, world
        This process's rank and the world size (``world > 1``: one ``all_reduce`` per step).
    event_bus
        Where trigger verdicts are published (``None``: nowhere).
    durable
        ``fsync`` the files (the collector's ``WatchSettings.durable``).
    """

    def __init__(
        self,
        config: FlightRecorder,
        reader: SiteReader,
        channels: Sequence[Channel],
        run_dir: Any,
        rank: int = 0,
        world: int = 1,
        event_bus: Any = None,
        durable: bool = True,
    ) -> None:
        self.config, self.reader, self.channels = config, reader, list(channels)
        self.rank, self.world, self.event_bus = rank, world, event_bus
        self.window = FlightWindow(config.window, len(self.channels))
        self.files = None if run_dir is None else ForensicsFiles(run_dir, durable)
        self.triggers = config.active_triggers
        self.loss_keys: tuple[str, ...] = tuple(
            k for t in self.triggers if isinstance(t, LossSpike) for k in t.keys
        ) or ("loss", "train/loss")
        self.rows: list[dict[str, Any]] = []  # every trigger row (also on disk)
        self.dense_to = -1  # last dense step scheduled (and refractory until then)
        self.failed: set[str] = set()
        self._commits = -1
        self._error: str | None = None
        #: with a background artifact writer: its run_beside, and the thread's copy of the window
        self._beside: Any = None
        self._mirror: FlightWindow | None = None
        self._ring_due: int | None = None  # a commit whose window the mirror has not reached
        self._thread_error: str | None = None  # a file write that failed on the writer thread
        if self.files is not None:
            self.files.open(self.channels, config.describe(), rank, world)

    @property
    def live(self) -> bool:
        return self.reader.live

    def write_beside(self, writer: Any) -> None:
        """Save through ``writer``'s thread (a background :class:`HistoryWriter`): the window's
        rows follow the steps there, ``ring.npy`` is rewritten there at each commit (the window
        at the committed step, as on the training thread) and a trigger's files too."""
        if self.files is None or not getattr(writer, "background", False):
            return
        self._beside = writer.run_beside
        self._mirror = FlightWindow(self.config.window, len(self.channels))
        writer.on_commit.append(self._committed)

    def _mirror_push(self, step: int, values: np.ndarray, present: np.ndarray) -> None:
        """(The writer thread) the row of ``step``; the window saved once a commit reaches it."""
        assert self._mirror is not None
        self._mirror.push(step, values, present)
        if self._ring_due is not None and step >= self._ring_due:
            self._ring_due = None
            self._save_mirror()

    def _committed(self, committed_step: int | None) -> None:
        """(The writer thread) a commit is durable: save the window at its step, now or once
        the mirror has its row (it follows the step's block in the queue)."""
        mirror = self._mirror
        if mirror is None or committed_step is None:
            return
        steps = mirror.rows(1)[0]
        if len(steps) and int(steps[-1]) >= committed_step:
            self._save_mirror()
        else:
            self._ring_due = committed_step

    def _save_mirror(self) -> None:
        assert self._mirror is not None and self.files is not None
        self._guarded_write(self.files.write_ring, *self._mirror.rows())

    def attach_optimizer(self, optimizer: Any) -> None:
        """Read ``optimizer``'s steps (idempotent)."""
        if self.live:
            self._guard(self.reader.attach_optimizer, optimizer)

    def dense_at(self, step: int) -> bool:
        """Whether ``step`` is one of the dense steps after a trigger."""
        return step <= self.dense_to and self.live

    # ------------------------------------------------------------------ per step
    def end_step(
        self,
        step: int,
        scalars: Mapping[str, float],
        axes: tuple[int | None, int | None],
        commits: int | None,
    ) -> None:
        """The step ``step`` was written: read it, check it, save on a trigger.

        ``axes`` is ``(examples_seen, epoch)`` after it; ``commits`` the artifact's commit count
        (a new commit rewrites ``ring.npy``).
        """
        if self.live:
            self._guard(self._end_step, step, scalars, axes, commits)

    def _end_step(
        self,
        step: int,
        scalars: Mapping[str, float],
        axes: tuple[int | None, int | None],
        commits: int | None,
    ) -> None:
        if self._thread_error is not None:  # a write on the writer thread failed
            raise OSError(self._thread_error)
        values, present = self.reader.read()
        loss = next((scalars[k] for k in self.loss_keys if k in scalars), None)
        if loss is not None:
            values[0], present[0] = float(loss), True
        crossings: list[Crossing] = []
        if step > self.dense_to:  # within a trigger's dense steps: no new trigger
            _, hv, hp = self.window.rows()
            reading = StepReading(step, self.channels, values, present, scalars)
            crossings = check_triggers(self.triggers, reading, hv, hp, self.failed)
        self.window.push(step, values, present)
        fired = bool(crossings)
        agreed = self._agree(fired) if self.world > 1 else fired
        if agreed and step > self.dense_to:
            self._fire(step, crossings, axes, agreed and not fired)
        if self._beside is not None:  # the writer thread's copy follows (saved at commits)
            row = (step, np.array(values, dtype=np.float64), np.array(present, dtype=bool))
            self._beside(lambda: self._mirror_push(*row), urgent=False)
        elif self.files is not None and commits is not None and commits != self._commits:
            self._commits = commits
            self.files.write_ring(*self.window.rows())

    def _agree(self, fired: bool) -> bool:
        """Whether some rank fired at this step (one 1-element ``all_reduce``, max)."""
        dist = torch.distributed
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1 if fired else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _fire(
        self,
        step: int,
        crossings: list[Crossing],
        axes: tuple[int | None, int | None],
        other_rank: bool,
    ) -> None:
        m = self.config.dense_steps
        names = list(dict.fromkeys(c.trigger for c in crossings)) or ["another_rank"]
        reason = f"flight recorder trigger {', '.join(names)} at step {step}" + (
            " (on another rank)" if other_rank else ""
        )
        self.dense_to = step + m if m else step
        row: dict[str, Any] = {
            "step": step,
            "rank": self.rank,
            "world_size": self.world,
            "agreed": other_rank,
            "crossings": [c.to_dict() for c in crossings],
            "dense": {
                "from_step": step + 1 if m else None,
                "to_step": step + m if m else None,
                "spine": 1,
                "reason": reason,
            },
            "lookback": self.config.lookback,
            "time": time.time(),
        }
        steps, values, present = self.window.rows()
        row["window_steps"] = [int(steps[0]), int(steps[-1])]
        if self.files is not None and self._beside is not None:  # encoded here, written there
            row, data = self.files.trigger_row(row, steps, values, present)
            files = self.files
            self._beside(lambda: self._guarded_write(files.write_trigger_file, row, data))
        elif self.files is not None:
            row = self.files.write_trigger(row, steps, values, present)
        else:
            row["_window"] = (steps, values, present)
        self.rows.append(row)
        self._publish(step, crossings, axes, reason)

    def _publish(
        self,
        step: int,
        crossings: list[Crossing],
        axes: tuple[int | None, int | None],
        reason: str,
    ) -> None:
        bus = self.event_bus
        if bus is None or not getattr(bus, "active", True):
            return
        at = Axes(step, axes[0], axes[1])
        events = [
            VerdictEvent(
                f"forensics/{c.trigger}",
                at,
                Verdict(
                    "flight_recorder",
                    "record",
                    f"{c.channel} = {c.value:.6g} crossed {c.limit if c.limit is not None else 'finite'}"
                    f"; {reason}",
                    None if math.isnan(c.value) else c.value,
                    None,
                    c.limit,
                ),
                field=c.channel,
            )
            for c in crossings
        ]
        if events:
            bus.publish(events)

    # ------------------------------------------------------------------ results
    def spikes(self) -> list[Spike]:
        """The triggers so far (attribution from the windows in memory)."""
        out = []
        for row in self.rows:
            window = row.get("_window")  # RAM only: the window itself; else its file
            if window is None and self.files is not None:
                w = self.files.window(row, len(self.channels))
                window = (w.steps, w.values, w.present)
            if window is None:
                continue
            steps, values, present = window
            out.append(
                spike_from_row(row, steps, values, present, self.channels, self.config.lookback)
            )
        return out

    def close(self) -> None:
        """Remove the hooks and write the window a last time (never raises)."""
        self.reader.remove()
        if self.files is not None and self._error is None:
            try:
                self.files.write_ring(*self.window.rows())
            except Exception as e:  # closing never fails for telemetry reasons
                self._warn(e)
        self.reader.live = False

    def _guarded_write(self, fn: Any, *args: Any) -> None:
        """(The writer thread) a file write that must not raise there: a failure stops the
        recorder at the next step, as one on the training thread does."""
        try:
            fn(*args)
        except Exception as e:
            self._thread_error = self._thread_error or f"{type(e).__name__}: {e}"

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:  # telemetry never raises into the training step
            self._warn(e)
            self.reader.live = False
            self.reader.remove()

    def _warn(self, e: BaseException) -> None:
        if self._error is None:
            self._error = f"{type(e).__name__}: {e}"
            warnings.warn(
                f"stepscope: the flight recorder stopped ({self._error}); the collector "
                "carries on without it.",
                RuntimeWarning,
                stacklevel=4,
            )

"""``FlightRecorder``: the settings of spike forensics (``WatchSettings(flight_recorder=...)``).

With a flight recorder, a :class:`~stepscope.HistoryCollector` reads a cheap set of per-site
scalars at **every** step (whatever its cadence; :mod:`stepscope.forensics.channels` defines
them), keeps the last ``window`` steps in RAM, and checks each step with its ``triggers``. When one
fires at step ``t``:

1. a ``verdict`` event (``forensics/<trigger>``) goes on the settings' event bus;
2. the window's rows up to ``t`` are written to the artifact at full resolution
   (``forensics/window-<t>.npy``: observed steps, held in RAM until then);
3. every stream's spine is taken at each of the steps ``t+1 .. t+dense_steps`` (a cadence change
   recorded with its reason in the trigger's row);
4. the trigger's row is appended to ``forensics/triggers.log`` (the run's list of triggers).

Triggers that fire within ``dense_steps`` after a trigger are not new triggers (the spike is
still being recorded densely). The window is also written after every artifact commit
(``forensics/ring.npy``), so that after a crash or ``kill -9`` what it held at the last commit is
on disk. Under ``torch.distributed`` each rank keeps its own window (in its own segment, rank in
the run record) and the ranks agree on a trigger with one 1-element ``all_reduce`` per step (so
that all go dense together). Read the triggers back with ``stepscope.open_run(path).spikes()``
or ``stepscope spikes RUN``.

Example
-------
>>> import stepscope as ss
>>> rec = ss.FlightRecorder(window=32, dense_steps=8)
>>> rec.describe()["triggers"][0]["trigger"]
'loss_spike'
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope.errors import Refusal
from stepscope.forensics.channels import RECORDER_STREAMS
from stepscope.forensics.detector import Trigger, default_triggers

__all__ = ["FlightRecorder"]


@dataclass(frozen=True)
class FlightRecorder:
    """Every-step per-site scalars in a bounded RAM window, and the triggers that save it.

    Parameters
    ----------
    window
        Steps held in RAM (the rows saved on a trigger, and the triggers' trailing range).
    streams
        What is read every step: any of ``gradient`` (``grad_rms``), ``update``
        (``update_rms``, ``update_ratio``), ``parameter`` (``param_rms``), ``activation``
        (``act_absmax``). The recorder reads the collector's sites (``sites=``), whatever the
        collector's own streams. The default, gradients and updates, is the set that fits the
        default cadence's budget (``docs/forensics.md``): ``activation`` adds a forward hook per
        module at every step (and keeps the collector's own hooks from resting on quiet steps),
        about 8% of a CPU step on the benchmark models.
    triggers
        :class:`~stepscope.forensics.Trigger` s (default
        :func:`~stepscope.forensics.default_triggers`: loss spike, non-finite, gradient-norm
        spike, update-ratio spike, threshold 6).
    dense_steps
        After a trigger, the collector takes every stream's spine at each of this many steps.
    lookback
        Attribution: how many steps before a trigger are searched for the layers that moved
        first (each compared with its own ``trailing`` earlier steps).
    sites
        Which of the collector's sites the recorder reads: ``None`` (all), a glob or list of
        globs over site names (parameters ``"h.0.mlp.0.weight"``, modules ``"h.0.mlp.0"``), or a
        predicate ``name -> bool``. On CPU, where the cost is mostly per site, reading fewer
        sites is how the recorder is sampled (e.g. ``sites="*.weight"``: no biases, no
        normalization scales' siblings, no module outputs).
    """

    window: int = 64
    streams: Sequence[str] = ("gradient", "update")
    triggers: Sequence[Trigger] | None = None
    dense_steps: int = 32
    lookback: int = 16
    sites: str | Sequence[str] | Callable[[str], bool] | None = None
    _triggers: tuple[Trigger, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bad = []
        for name, lo in (("window", 4), ("dense_steps", 0), ("lookback", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                bad.append(f"{name}={v!r} must be an int >= {lo}")
        streams = (self.streams,) if isinstance(self.streams, str) else tuple(self.streams)
        unknown = [s for s in streams if s not in RECORDER_STREAMS]
        if unknown or not streams:
            bad.append(f"streams {unknown or list(streams)} not among {list(RECORDER_STREAMS)}")
        triggers = default_triggers() if self.triggers is None else tuple(self.triggers)
        sites = self.sites
        if not (
            sites is None
            or callable(sites)
            or isinstance(sites, str)
            or (isinstance(sites, (list, tuple)) and all(isinstance(g, str) for g in sites))
        ):
            bad.append(f"sites={sites!r} must be None, a glob, a list of globs or a predicate")
        if not all(isinstance(t, Trigger) for t in triggers):
            bad.append("triggers must be stepscope.forensics Trigger objects")
        if bad:
            raise Refusal(
                "settings_invalid",
                "invalid FlightRecorder: " + "; ".join(bad) + ".",
                [
                    "e.g. ss.FlightRecorder(window=64, streams=('gradient', 'update'), dense_steps=32)"
                ],
            )
        object.__setattr__(self, "streams", tuple(dict.fromkeys(streams)))
        object.__setattr__(self, "_triggers", triggers)

    def reads(self, site: str) -> bool:
        """Whether the recorder reads the site named ``site``."""
        sites = self.sites
        if sites is None:
            return True
        if callable(sites):
            return bool(sites(site))
        globs = (sites,) if isinstance(sites, str) else sites
        return any(fnmatch.fnmatchcase(site, g) for g in globs)

    @property
    def active_triggers(self) -> tuple[Trigger, ...]:
        """The triggers in force (the defaults when none were given)."""
        return self._triggers

    def describe(self) -> dict[str, Any]:
        """JSON-safe description (the run record's ``flight_recorder`` and every trigger row)."""
        return {
            "window": self.window,
            "streams": list(self.streams),
            "dense_steps": self.dense_steps,
            "lookback": self.lookback,
            "sites": getattr(self.sites, "__name__", "predicate")
            if callable(self.sites)
            else self.sites,
            "triggers": [t.describe() for t in self._triggers],
        }

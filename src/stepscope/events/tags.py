"""What a person sees in TensorBoard and W&B: one conversion from events to tracker records.

Every tracker that draws (:class:`~stepscope.events.TensorBoardTracker`,
:class:`~stepscope.events.WandbTracker`), live during training and in ``stepscope export``, turns
the events of a step into records with one :class:`TagLayout`. Tags are grouped by stream, then
site, then quantity, so TensorBoard's sections are ``act``, ``grad``, ``param``, ``update``:

==================  ===================================================================
tag                 quantity (over the finite elements of the site's tensor)
==================  ===================================================================
``act/<site>/rms``            ``sqrt(mean**2 + std**2)`` of the module output
``act/<site>/absmax``         largest ``|x|``
``act/<site>/zero_fraction``  exact zeros / all elements (dead ReLUs)
``act_grad/<site>/rms``, ``act_grad/<site>/absmax``  the output's gradient
``grad/<site>/norm``          l2 norm of the parameter gradient the optimizer consumed
``grad/<site>/absmax``, ``grad/<site>/zero_fraction``
``param/<site>/norm``, ``param/<site>/absmax``  the parameter after the step
``update/<site>/ratio``       ``l2(update) / l2(parameter)`` (a sampled update: the ratio of
                              RMS, ``estimated``), as :class:`~stepscope.events.UpdateRatioCheck`
``<stream>/<site>/nonfinite`` NaN + inf count, written only on steps where it is > 0
``health/nonfinite``          NaN + inf values over every site and stream of the step
``<p>/confusion``             a ``<p>/confusion/<true>/<predicted>`` family of user scalars as
                              one matrix (an image in TensorBoard, a table in W&B)
``<stream>/<site>``           the site's exact histogram (histogram steps)
==================  ===================================================================

User scalars keep their own names (``loss``, ``train/lr``, ``clock/...``). ``detail="full"``
adds the rest: every spine quantity (``norm, rms, mean, std, min, max, absmax, zero_fraction,
nonfinite``) for every stream, micro-batch cells (``grad/<site>/mb<k>/norm``), phases other
than the stream's own (``grad/<site>/<phase>/norm``), the histogram's ``nan``/``posinf``/
``neginf`` counts, the confusion cells and predicted-class counts as scalars, every dense-probe
row (by default only :data:`PROBE_DEFAULT` per layer and ``probe/model/{loss,
accuracy_fraction}``) and auto-cadence rows (``cadence/...``). ``unavailable`` events never
become records (nothing is drawn as 0).

Example
-------
>>> from stepscope.events import Axes, ScalarEvent
>>> layout = TagLayout()
>>> [r.tag for r in layout.records([ScalarEvent("loss", Axes(3), 0.5)])]
['loss']
"""

from __future__ import annotations

import enum
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.events.checks.builtin import UpdateRatioCheck
from stepscope.events.coordinates import Axes
from stepscope.events.event import (
    EventSource,
    HistogramEvent,
    ObserverEvent,
    ScalarEvent,
    VerdictEvent,
)
from stepscope.events.payload import HistogramPayload
from stepscope.events.views import nonfinite_counts
from stepscope.history.vocab import Phase, Stream

__all__ = [
    "DEFAULT_QUANTITIES",
    "PROBE_DEFAULT",
    "STREAM_TAG",
    "Detail",
    "HistogramRecord",
    "MatrixRecord",
    "ScalarRecord",
    "TagLayout",
    "TextRecord",
    "TrackerRecord",
    "run_name",
]


class Detail(str, enum.Enum):
    """How much a tracker draws: the readable default set, or every quantity."""

    DEFAULT = "default"
    FULL = "full"


#: The tag group of each stream.
STREAM_TAG: dict[Stream, str] = {
    Stream.ACTIVATION: "act",
    Stream.ACTIVATION_GRAD: "act_grad",
    Stream.GRADIENT: "grad",
    Stream.PARAMETER: "param",
    Stream.UPDATE: "update",
}

#: The stream's own phases (no phase in the tag); a gradient of a skipped step is ``backward``.
_OWN_PHASES: dict[Stream, frozenset[Phase]] = {
    Stream.ACTIVATION: frozenset({Phase.FORWARD}),
    Stream.ACTIVATION_GRAD: frozenset({Phase.BACKWARD}),
    Stream.GRADIENT: frozenset({Phase.PRE_STEP, Phase.BACKWARD}),
    Stream.PARAMETER: frozenset({Phase.POST_STEP, Phase.PRE_STEP}),  # one of them per run
    Stream.UPDATE: frozenset({Phase.POST_STEP}),
}

#: The default quantities per stream (``update`` adds ``ratio``, ``nonfinite`` when > 0).
DEFAULT_QUANTITIES: dict[Stream, tuple[str, ...]] = {
    Stream.ACTIVATION: ("rms", "absmax", "zero_fraction"),
    Stream.ACTIVATION_GRAD: ("rms", "absmax"),
    Stream.GRADIENT: ("norm", "absmax", "zero_fraction"),
    Stream.PARAMETER: ("norm", "absmax"),
    Stream.UPDATE: (),
}
_ALL_QUANTITIES = ("norm", "rms", "mean", "std", "min", "max", "absmax", "zero_fraction")
#: Spine event fields under their tag names (``l2`` is drawn as ``norm``).
_FIELD_TAG = {"l2": "norm", "nonfinite_count": "nonfinite"}

#: Dense-probe rows drawn by default, per layer (``probe/<layer>/<name>``).
PROBE_DEFAULT: frozenset[str] = frozenset(
    {
        "activation_zero_fraction",
        "backprop_zero_fraction",
        "gradient_diversity",
        "grad_norm_rms",
        "fisher_trace",
        "update_ratio",
    }
)
_PROBE_MODEL_DEFAULT = frozenset({"loss", "accuracy_fraction"})
_CONFUSION = re.compile(r"^(?P<prefix>.*?)/?confusion/(?P<true>\d+)/(?P<pred>\d+)$")
_PREDICTED = re.compile(r"^(?P<prefix>.*?)/?predicted_counts/\d+$")


@dataclass(frozen=True, slots=True)
class ScalarRecord:
    """One number under ``tag`` (``estimated``: from a sample, see the event's docs)."""

    tag: str
    axes: Axes
    value: float
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class HistogramRecord:
    """A site's exact histogram under ``tag``."""

    tag: str
    axes: Axes
    histogram: HistogramPayload


@dataclass(frozen=True, slots=True)
class MatrixRecord:
    """A confusion matrix ``counts[true, predicted]`` (int64) under ``tag``."""

    tag: str
    axes: Axes
    counts: np.ndarray


@dataclass(frozen=True, slots=True)
class TextRecord:
    """A text entry (a check's verdict) under ``tag``."""

    tag: str
    axes: Axes
    text: str


TrackerRecord = ScalarRecord | HistogramRecord | MatrixRecord | TextRecord


def _own(e: ObserverEvent) -> bool:
    """Whether a site event is its stream's own row (its phase, not a micro-batch partial)."""
    return e.micro_batch is None and e.stream is not None and e.phase in _OWN_PHASES[e.stream]


class TagLayout:
    """Turns one step's events into tracker records (tags: see the module docstring).

    Parameters
    ----------
    detail
        ``"default"`` (the readable set) or ``"full"`` (every quantity).

    The layout pairs each site's ``update`` and ``parameter`` rows of a step for the update
    ratio (an :class:`~stepscope.events.UpdateRatioCheck` with an open band does the pairing
    and the arithmetic), so it is fed one step's events at a time, in step order.
    """

    def __init__(self, detail: Detail | str = Detail.DEFAULT) -> None:
        self.detail = Detail(detail)
        self._ratio = UpdateRatioCheck(lower=0.0, upper=math.inf, parameter_phase=None)

    @property
    def full(self) -> bool:
        return self.detail is Detail.FULL

    def records(self, events: Sequence[ObserverEvent]) -> list[TrackerRecord]:
        """The records of ``events`` (one step's, usually): spine rows, user scalars, histograms."""
        out: list[TrackerRecord] = []
        rows: dict[tuple[str, Axes], dict[str, ScalarEvent]] = {}
        user: list[ScalarEvent] = []
        health: dict[Axes, float] = {}
        for e in events:
            if isinstance(e, ScalarEvent):
                if e.source is EventSource.CHECK and e.field == "update_to_weight_ratio":
                    if self.full:  # an UpdateRatioCheck's ratio: drawn as update/<site>/ratio
                        user.append(e)
                elif e.source is EventSource.SPINE and e.stream is not None and e.field:
                    prefix = self._prefix(e)
                    if e.field == "nonfinite_count" and _own(e):  # no partial counted twice
                        health[e.axes] = health.get(e.axes, 0.0) + e.value
                    if prefix is not None:
                        rows.setdefault((prefix, e.axes), {})[e.field] = e
                else:
                    user.append(e)
            elif isinstance(e, HistogramEvent):
                out.extend(self._histogram(e))
            elif isinstance(e, VerdictEvent):
                v = e.verdict
                out.append(TextRecord(e.name, e.axes, f"[{v.action}] {v.message}"))
        for (prefix, axes), fields in rows.items():
            out.extend(self._row(prefix, axes, fields))
        out.extend(self._ratios(events))
        out.extend(ScalarRecord("health/nonfinite", a, v) for a, v in health.items())
        out.extend(self._user(user))
        return out

    # -- site rows -------------------------------------------------------------------------
    def _prefix(self, e: ObserverEvent) -> str | None:
        """``<stream>/<site>`` (plus ``/<phase>``, ``/mb<k>`` in full detail); ``None``: hidden."""
        stream, phase = e.stream, e.phase
        assert stream is not None
        base = f"{STREAM_TAG[stream]}/{e.site}"
        if _own(e):
            return base
        if not self.full:
            return None
        if phase not in _OWN_PHASES[stream] and phase is not None:
            base = f"{base}/{phase.value}"
        return base if e.micro_batch is None else f"{base}/mb{e.micro_batch}"

    def _row(
        self, prefix: str, axes: Axes, fields: Mapping[str, ScalarEvent]
    ) -> list[ScalarRecord]:
        stream = next(iter(fields.values())).stream
        assert stream is not None
        estimated = any(e.estimated for e in fields.values())
        values = {_FIELD_TAG.get(f, f): e.value for f, e in fields.items()}
        if "mean" in values and "std" in values:
            values["rms"] = math.sqrt(values["mean"] ** 2 + values["std"] ** 2)
        wanted = _ALL_QUANTITIES if self.full else DEFAULT_QUANTITIES[stream]
        out = [
            ScalarRecord(f"{prefix}/{q}", axes, values[q], estimated) for q in wanted if q in values
        ]
        nonfinite = values.get("nonfinite")
        if nonfinite is not None and (self.full or nonfinite > 0):
            out.append(ScalarRecord(f"{prefix}/nonfinite", axes, nonfinite))
        return out

    def _ratios(self, events: Sequence[ObserverEvent]) -> list[ScalarRecord]:
        out = []
        for d in self._ratio.evaluate(events):
            if isinstance(d, ScalarEvent) and d.field == "update_to_weight_ratio":
                tag = f"{STREAM_TAG[Stream.UPDATE]}/{d.site}/ratio"
                out.append(ScalarRecord(tag, d.axes, d.value, d.estimated))
        return out

    def _histogram(self, e: HistogramEvent) -> list[TrackerRecord]:
        prefix = self._prefix(e)
        if prefix is None:
            return []
        out: list[TrackerRecord] = [HistogramRecord(prefix, e.axes, e.histogram)]
        if self.full:
            for name, count in nonfinite_counts(e.histogram).items():
                out.append(ScalarRecord(f"{prefix}/{name}", e.axes, float(count)))
        return out

    # -- user scalars ----------------------------------------------------------------------
    def _user(self, scalars: Sequence[ScalarEvent]) -> list[TrackerRecord]:
        cells: dict[tuple[str, Axes], dict[tuple[int, int], float]] = {}
        for e in scalars:
            m = _CONFUSION.match(e.name)
            if m is not None:
                key = (m["prefix"], e.axes)
                cells.setdefault(key, {})[(int(m["true"]), int(m["pred"]))] = e.value
        matrices = {prefix for prefix, _ in cells}
        out: list[TrackerRecord] = []
        for e in scalars:
            if self.full or self._shown(e.name, matrices):
                out.append(ScalarRecord(e.name, e.axes, e.value, e.estimated))
        for (prefix, axes), found in cells.items():
            n = 1 + max(max(t, p) for t, p in found)
            counts = np.zeros((n, n), dtype=np.int64)
            for (t, p), v in found.items():
                counts[t, p] = int(v)
            tag = f"{prefix}/confusion" if prefix else "confusion"
            out.append(MatrixRecord(tag, axes, counts))
        return out

    @staticmethod
    def _shown(name: str, matrices: set[str]) -> bool:
        """Whether a user scalar is in the default set."""
        if _CONFUSION.match(name):
            return False  # drawn as one matrix
        m = _PREDICTED.match(name)
        if m is not None and m["prefix"] in matrices:
            return False  # the confusion matrix's column sums
        if name.startswith("cadence/"):
            return False
        parts = name.split("/")
        if parts[0] == "probe" and len(parts) >= 3:
            if parts[1] == "model":
                return len(parts) == 3 and parts[2] in _PROBE_MODEL_DEFAULT
            return len(parts) == 3 and parts[2] in PROBE_DEFAULT
        return True


def run_name(record: Any, path: str | os.PathLike[str] | None = None) -> str:
    """The name a run gets in TensorBoard and W&B: its directory's name, not its hex id.

    The artifact directory's name; a ``version_<N>`` or ``rank<NNN>`` directory keeps its
    parent's name in front (``exp/version_3``). Without a directory: the run id.

    >>> from types import SimpleNamespace
    >>> rec = SimpleNamespace(run_id="9f3c2a")
    >>> run_name(rec, "runs/plain-seed0"), run_name(rec, "runs/exp/version_3"), run_name(rec)
    ('plain-seed0', 'exp/version_3', '9f3c2a')
    """
    if path is None:
        return str(record.run_id)
    p = Path(os.path.abspath(path))
    parts = [p.name]
    while re.fullmatch(r"version_\d+|rank\d+", parts[0]) and p.parent != p:
        p = p.parent
        parts.insert(0, p.name)
    name = "/".join(x for x in parts if x)
    return name or str(record.run_id)

"""Historical overlays: sparse evaluation points of another source/recipe/hardware regime.

An overlay file (``stepscope report --overlay FILE.json``) holds only the evaluation points that
were actually saved by an older run (first, extrema, last, ...). They are drawn as isolated
markers in a distinct style, labelled with their regime, never joined into a curve and never
averaged with the runs. A historical ``val_*`` metric is the old script's official *test*
evaluation, so it is labelled ``official test (historical val_*)``, not modern validation.

File layout::

    {"label": "legacy 425pu650",
     "regime": "historical: different source, recipe and hardware",
     "source": "free text (where the numbers come from)",
     "x_axis": "optimizer_step",
     "points": [{"name": "val_acc", "optimizer_step": 0, "value": 9.8,
                 "unit": "pct", "note": "first"}, ...]}

``name``: ``<prefix>_<metric>`` with prefix ``val`` (official test), ``test`` or ``train`` and
metric ``acc``/``accuracy`` (``unit`` ``pct`` 0-100 or ``fraction``, default ``fraction``) or
``loss``/``ce`` (nats/example).

Example
-------
>>> ov = parse_overlay({"label": "old", "regime": "historical", "points": [
...     {"name": "val_acc", "optimizer_step": 100, "value": 97.5, "unit": "pct"}]})
>>> p = ov.points[0]
>>> p.split, p.metric, p.value
('official test (historical val_*)', 'accuracy', 0.975)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stepscope.errors import Refusal

SPLITS = {
    "val": "official test (historical val_*)",
    "test": "official test",
    "train": "training set (historical)",
}
METRICS = {
    "acc": "accuracy",
    "accuracy": "accuracy",
    "loss": "cross-entropy",
    "ce": "cross-entropy",
}


@dataclass(frozen=True)
class OverlayPoint:
    """One saved historical evaluation: split label, metric, optimizer step and value."""

    split: str
    metric: str  # "accuracy" (fraction) or "cross-entropy" (nats/example)
    optimizer_step: float
    value: float
    note: str = ""


@dataclass(frozen=True)
class Overlay:
    """A set of sparse historical points with the label and regime they are drawn under."""

    label: str
    regime: str
    source: str
    points: tuple[OverlayPoint, ...]

    @property
    def legend(self) -> str:
        """The legend text prefix: ``historical · <label> · <regime>``."""
        return f"historical · {self.label} · {self.regime}"


def _invalid(message: str) -> Refusal:
    return Refusal(
        "overlay_invalid",
        message,
        ["see stepscope.report.overlay for the file layout (label, regime, points[])"],
    )


def _point(raw: Any, i: int) -> OverlayPoint:
    if not isinstance(raw, Mapping):
        raise _invalid(f"points[{i}] is not an object")
    name = str(raw.get("name", ""))
    prefix, _, metric = name.partition("_")
    if prefix not in SPLITS or metric not in METRICS:
        raise _invalid(f"points[{i}].name {name!r} is not <val|test|train>_<acc|accuracy|loss|ce>")
    step, value = _finite(raw.get("optimizer_step")), _finite(raw.get("value"))
    if step is None or value is None or step < 0:
        raise _invalid(f"points[{i}] needs a finite optimizer_step >= 0 and a finite value")
    unit = raw.get("unit", "fraction")
    if unit not in ("pct", "fraction"):
        raise _invalid(f"points[{i}].unit {unit!r} is not 'pct' or 'fraction'")
    if METRICS[metric] == "accuracy" and unit == "pct":
        value = value / 100.0
    return OverlayPoint(SPLITS[prefix], METRICS[metric], step, value, str(raw.get("note", "")))


def _finite(raw: object) -> float | None:
    """A JSON number as a float, or ``None`` for anything else (bools, strings, NaN, inf)."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
        return float(raw)
    return None


def parse_overlay(doc: Any) -> Overlay:
    """Validate an overlay document (see the module docstring)."""
    if not isinstance(doc, Mapping):
        raise _invalid("an overlay file must hold a JSON object")
    for key in ("label", "regime"):
        if not isinstance(doc.get(key), str) or not doc[key].strip():
            raise _invalid(f"{key!r} must be a non-empty string (the regime is always labelled)")
    if doc.get("x_axis", "optimizer_step") != "optimizer_step":
        raise _invalid("only x_axis 'optimizer_step' is supported")
    points = doc.get("points")
    if not isinstance(points, list) or not points:
        raise _invalid("'points' must be a non-empty list")
    return Overlay(
        doc["label"],
        doc["regime"],
        str(doc.get("source", "")),
        tuple(_point(p, i) for i, p in enumerate(points)),
    )


def load_overlay(path: str | os.PathLike[str]) -> Overlay:
    """Read and validate an overlay JSON file; refuses ``overlay_invalid``."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise _invalid(f"{path}: not a readable JSON file ({exc})") from None
    return parse_overlay(doc)


__all__ = ["Overlay", "OverlayPoint", "load_overlay", "parse_overlay"]

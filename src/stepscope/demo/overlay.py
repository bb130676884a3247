"""The demo's overlay example: how historical evaluation points enter the report.

The points below are **illustrative** (a format demonstration, not measurements of any run): they
are sparse saved evaluation points of a hypothetical older run, drawn by
``stepscope report --overlay FILE.json`` (:mod:`stepscope.report.overlay`) as hollow markers
labelled with their regime. Pass ``stepscope demo --overlay FILE.json`` to use real saved points
instead (first / extremum / last evaluations of an old run), or ``--no-overlay`` to draw none.

Example
-------
>>> from stepscope.report.overlay import parse_overlay
>>> parse_overlay(EXAMPLE_OVERLAY).points[0].split
'official test (historical val_*)'
"""

from __future__ import annotations

import json
from pathlib import Path

EXAMPLE_OVERLAY: dict = {
    "label": "illustrative example, not measured",
    "regime": "historical: different source, recipe and hardware",
    "source": "stepscope.demo.overlay.EXAMPLE_OVERLAY (format demonstration only)",
    "x_axis": "optimizer_step",
    "points": [
        {"name": "val_acc", "optimizer_step": 0, "value": 10.0, "unit": "pct", "note": "first"},
        {"name": "val_acc", "optimizer_step": 110, "value": 80.0, "unit": "pct", "note": "best"},
        {"name": "val_acc", "optimizer_step": 220, "value": 78.0, "unit": "pct", "note": "last"},
        {"name": "val_loss", "optimizer_step": 0, "value": 2.30, "note": "first"},
        {"name": "val_loss", "optimizer_step": 220, "value": 0.75, "note": "last"},
    ],
}


def write_example_overlay(directory: str | Path) -> Path:
    """Write :data:`EXAMPLE_OVERLAY` as ``overlay-example.json`` in ``directory``."""
    path = Path(directory) / "overlay-example.json"
    path.write_text(json.dumps(EXAMPLE_OVERLAY, indent=1) + "\n", encoding="utf-8")
    return path

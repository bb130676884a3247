"""The run-record section: versions, hashes, cadences and measured overhead, as tables.

Measured overhead comes from the run log's ``runlog.json`` (training, telemetry and elapsed
seconds and their ``overhead_fraction``, :mod:`stepscope.runlog`), else from the run record's
``extra`` (``measurements``/``overhead``); otherwise the report says that none was recorded.

Example
-------
>>> from stepscope import open_run
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> record_section([open_run(run)]).details[0].title
'run record · ...'
"""

from __future__ import annotations

import json
import os
from typing import Any

from stepscope.history.files import read_json  # the one safe reader: regular, bounded
from stepscope.report.model import Item, Section, Table, fmt, fmt_unix, no_data, run_label
from stepscope.run import Run
from stepscope.runlog.sink import read_summary

#: Keys of ``RunRecord.extra`` that may hold measured overhead (first found is shown).
OVERHEAD_KEYS = ("measurements", "overhead", "measured_overhead")


def _flat(prefix: str, value: Any, out: list[list[str]]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        if isinstance(value, float):
            text = fmt(value)  # rounded like every other table number
        elif isinstance(value, str):
            text = value
        else:
            text = json.dumps(_rounded(value), default=str)
        out.append([prefix, text if len(text) < 200 else text[:197] + "..."])


def _rounded(value: Any) -> Any:
    """``value`` with every float inside rounded to the table's significant digits."""
    if isinstance(value, float):
        return float(fmt(value)) if fmt(value) not in ("nan", "inf", "-inf") else fmt(value)
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def record_section(runs: list[Run]) -> Section:
    """One table per run (run record, segments, storage) and one for measured overhead."""
    sec = Section("record", "Run record")
    for r in runs:
        h = r
        run = h.run
        rows: list[list[str]] = [
            ["path", str(r.path)],
            ["run_id", run.run_id],
            ["segments", ", ".join(s.segment_id for s in h.segments)],
            ["model_fingerprint", fmt(run.model_fingerprint)],
            ["rank / world_size", f"{run.rank} / {run.world_size}"],
            ["device", run.device],
            ["created", fmt_unix(run.created_unix)],
            ["committed steps", f"{len(h.steps)} ({_span(h.steps)})"],
            ["sites", str(len(h.sites))],
            ["scalar names", str(len(h.scalar_names))],
            ["stored bytes", ", ".join(f"{k}={v}" for k, v in sorted(h.sizes().items()))],
        ]
        _flat("packages", dict(run.packages), rows)
        _flat("histogram_descriptor", dict(run.histogram_descriptor), rows)
        _flat("cadences", dict(run.cadences), rows)
        extra = {k: v for k, v in run.extra.items() if k not in OVERHEAD_KEYS}
        _flat("extra", extra, rows)
        sec.details.append(Table(f"run record · {run_label(r)}", ["field", "value"], rows))
        sec.details.append(_overhead(r))
        accounting = _telemetry_accounting(r)
        if accounting is not None:
            sec.details.append(accounting)
    return sec


def _telemetry_accounting(r: Run) -> Item | None:
    """``RUN/telemetry.json`` (written by ``stepscope demo``): what the telemetry seconds were spent
    on (probe, serialisation, snapshots, checkpoints, hooks) and the overall fraction."""
    path = r.path / "telemetry.json"
    if not os.path.lexists(path):
        return None

    doc = read_json(path, "telemetry record", max_bytes=1 << 20)
    rows: list[list[str]] = []
    _flat("", {k: v for k, v in doc.items() if k != "cadence_qualification"}, rows)
    return Table(
        f"telemetry accounting · {run_label(r)} (telemetry.json)", ["measurement", "value"], rows
    )


def _span(steps: Any) -> str:
    return f"steps {int(steps[0])}..{int(steps[-1])}" if len(steps) else "none"


def _overhead(r: Run) -> Item:
    summary = _runlog_summary(r)
    if summary is not None:
        rows: list[list[str]] = []
        _flat("", summary, rows)
        return Table(
            f"measured overhead · {run_label(r)} (runlog.json)", ["measurement", "value"], rows
        )
    extra = r.run.extra
    for key in OVERHEAD_KEYS:
        if key in extra:
            found: list[list[str]] = []
            _flat(key, extra[key], found)
            return Table(f"measured overhead · {run_label(r)}", ["measurement", "value"], found)
    return no_data(
        f"measured overhead · {run_label(r)}",
        "RUN/runlog.json, run record extra." + " / extra.".join(OVERHEAD_KEYS),
    )


def _runlog_summary(r: Run) -> dict[str, Any] | None:
    """The clocks' summary (training/telemetry/elapsed seconds, overhead fraction), if written."""
    if not (r.path / "runlog.json").exists():
        return None

    summary = read_summary(r.path)
    return summary if isinstance(summary, dict) else None

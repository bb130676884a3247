"""The "before the spike" section: each flight-recorder trigger and the layers that moved first.

For every trigger of every run (:func:`stepscope.forensics.read_spikes`): a table of what
crossed and of the ranked layers that left their own trailing range first, and one plot of
those layers' every-step series over the saved window (each divided by its own trailing median,
so that layers of different scales share an axis; a vertical line at the trigger). The rows are
the window the recorder held in RAM and wrote at the trigger: every step, whatever the
collector's cadence. A run without a recorder, or where nothing fired, gets a note.

Example
-------
>>> from stepscope import open_run
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> spikes_section([open_run(run)]).key
'spikes'
"""

from __future__ import annotations

import numpy as np

from stepscope.forensics import read_spikes
from stepscope.report.model import Section, Table, fmt, no_data, run_label
from stepscope.report.plots import Trace, line_plot
from stepscope.run import Run

__all__ = ["spikes_section"]

#: Layers plotted per trigger (the table lists them all).
PLOTTED = 5


def spikes_section(runs: list[Run]) -> Section:
    """One table and one plot per trigger of each run."""
    sec = Section("spikes", "Before the spike (flight recorder)")
    found = False
    for r in runs:
        for s in read_spikes(r.path):
            found = True
            head = f"step {s.step} · rank {s.rank} · {run_label(r)}"
            rows = [
                ["crossed", c.channel, fmt(c.value), f"median {fmt(c.center)}", f"z {fmt(c.z)}"]
                for c in s.crossings
            ]
            if s.dense_from is not None:
                rows.append(["dense cadence", f"steps {s.dense_from}..{s.dense_to}", "", "", ""])
            rows += [
                [f"moved #{i}", f"{m.site}/{m.field}", fmt(m.value), f"median {fmt(m.center)}",
                 f"z {fmt(m.z)} at step {m.step}"]
                for i, m in enumerate(s.first, 1)
            ]  # fmt: skip
            if not s.first:
                rows.append(["moved", "no layer left its trailing range", "", "", ""])
            sec.items.append(
                Table(f"trigger {', '.join(s.triggers) or '(another rank)'} · {head}",
                      ["what", "channel", "value", "trailing", "when"], rows)
            )  # fmt: skip
            traces = []
            for m in s.first[:PLOTTED]:
                steps, v = s.column(m.site, m.field)
                traces.append(Trace(f"{m.site}/{m.field}", steps.astype(float), v / m.center))
            if traces:
                sec.items.append(
                    line_plot(
                        f"layers that moved first · {head}",
                        "optimizer step",
                        "value / own trailing median",
                        traces,
                        logy=bool(np.all([np.nanmin(t.y) > 0 for t in traces])),
                        markers=[(float(s.step), "trigger")],
                        caption="Every step of the saved window (held in RAM, written at the "
                        "trigger). Gaps: not observed at that step.",
                    )
                )
    if not found:
        sec.items.append(
            no_data(
                "flight-recorder triggers",
                "forensics/triggers.log (WatchSettings(flight_recorder=ss.FlightRecorder()))",
            )
        )
    return sec

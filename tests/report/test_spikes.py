"""The report's "before the spike" section, on a run with an injected spike and on one without."""

from __future__ import annotations

from pathlib import Path

import stepscope as ss
from stepscope import open_run
from stepscope.report.html import SECTION_KEYS
from stepscope.report.model import Note, Table
from stepscope.report.plots import Plot
from stepscope.report.spikes import spikes_section
from tests.forensics.spikekit import INJECTED, train


def test_section_tabulates_and_plots_the_layers_that_moved_first(tmp_path: Path) -> None:
    path = tmp_path / "run"
    rec = ss.FlightRecorder(window=32, dense_steps=4)
    train(50, ss.WatchSettings(output_dir=str(path), flight_recorder=rec, durable=False), 45)
    sec = spikes_section([open_run(path)])
    tables = [i for i in sec.items if isinstance(i, Table)]
    plots = [i for i in sec.items if isinstance(i, Plot)]
    assert len(tables) == 1 and len(plots) == 1
    moved = [row for row in tables[0].rows if row[0] == "moved #1"]
    assert moved and moved[0][1].startswith(INJECTED + ".") and "step 45" in moved[0][4]
    assert ["dense cadence", "steps 46..49", "", "", ""] in tables[0].rows
    assert SECTION_KEYS[:2] == ("curves", "spikes")  # right after the training curves


def test_a_run_without_triggers_gets_a_note_not_an_empty_plot(tmp_path: Path) -> None:
    path = tmp_path / "run"
    train(4, ss.WatchSettings(output_dir=str(path), durable=False))
    sec = spikes_section([open_run(path)])
    assert len(sec.items) == 1 and isinstance(sec.items[0], Note)
    assert "no data recorded: flight-recorder triggers" in sec.items[0].text

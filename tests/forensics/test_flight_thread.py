"""With the default background writer, the flight recorder's files are written on its thread.

The spike of :mod:`tests.forensics.test_flight` (a one-step learning-rate x100 on one layer at
step ``K``), with every file operation of the process spied on: from the end of the first step
to the end of the last, none runs on the training thread -- not the artifact's commits, not
``forensics/ring.npy`` (rewritten at each commit), not the trigger's window file and its
``triggers.log`` row -- and the trigger is saved all the same.
"""

from __future__ import annotations

import stepscope as ss
import tests.forensics.spikekit as kit
from stepscope.history.artifact import WRITER_THREAD
from tests.filekit import spy_file_ops

K, M, STEPS = 100, 8, 124


def test_the_flight_recorder_writes_nothing_on_the_training_thread(tmp_path, monkeypatch):
    calls: list = []
    spy_file_ops(monkeypatch, calls)
    marks = {0: "train", STEPS - 1: "close"}
    monkeypatch.setattr(kit, "AFTER_STEP", lambda step: calls.append(marks.get(step, "")))
    path = tmp_path / "run"
    rec = ss.FlightRecorder(window=64, dense_steps=M)
    settings = ss.WatchSettings(
        output_dir=str(path), flight_recorder=rec, commit_steps=16, commit_seconds=None
    )
    trained = kit.train(STEPS, settings, inject_at=K)
    monkeypatch.undo()
    assert trained.collector.writer.background  # the default, also with a flight recorder
    during = [c for c in calls[calls.index("train") + 1 : calls.index("close")] if c]
    assert {t for _, t, _ in during} == {WRITER_THREAD}, [
        c for c in during if c[1] != WRITER_THREAD
    ]
    targets = [target for op, _, target in during if op == "replace"]
    assert any(t.endswith("ring.npy") for t in targets)  # saved at the commits...
    assert any("window-" in t for t in targets)  # ...and the trigger's window
    assert [s.step for s in ss.open_run(path).spikes()] == [K]

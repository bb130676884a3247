"""JSONL lines and ``stepscope export``: a finished or killed run replays to the same events."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stepscope.cli import main
from stepscope.errors import Refusal
from stepscope.events import (
    EventKind,
    JsonlTracker,
    export_run,
    read_jsonl,
    step_events,
)
from stepscope.history import HistoryWriter, StepBlockRecord
from stepscope.history.sample import sample_run


def _same(a, b):
    """Events equal field by field (NaN user scalars compare equal to NaN)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        dx, dy = x.to_dict(), y.to_dict()
        assert dx == dy, (dx["name"], dx, dy)


def test_jsonl_has_one_line_per_event_with_the_three_axes(ev, tmp_path):
    log = tmp_path / "events.jsonl"
    run = ev.train(tmp_path / "run", n_steps=3, subscribers=[JsonlTracker(log)])
    lines = log.read_text().splitlines()
    live = [e for step in run.events for e in step]
    assert len(lines) == len(live)
    for line, e in zip(lines, live):
        d = json.loads(line)
        assert (d["optimizer_step"], d["examples_seen"], d["epoch"]) == (
            e.optimizer_step,
            e.examples_seen,
            e.epoch,
        )
        assert d["kind"] == e.kind.value and d["name"] == e.name
    _same(read_jsonl(log), live)


def test_export_replays_the_same_events_the_run_published(ev, tmp_path):
    run = ev.train(tmp_path / "run", n_steps=5, skip_activation_site=(2, "relu2"))
    replayed = list(step_events(tmp_path / "run", window=2))  # windows smaller than the run
    assert len(replayed) == 5
    for live, again in zip(run.events, replayed):
        _same(again, live)


def test_cli_export_writes_tensorboard_jsonl_and_an_offline_wandb_run(
    ev, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator as ea

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = ev.train(tmp_path / "run", n_steps=3)
    code = main(
        [
            "export",
            str(tmp_path / "run"),
            "--tensorboard",
            str(tmp_path / "tb"),
            "--jsonl",
            str(tmp_path / "out.jsonl"),
            "--wandb",
            str(tmp_path / "wb"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "3 steps" in out and "x-axis: optimizer_step" in out
    assert "exported run run (id events-test)" in out  # its name first, the id beside it
    _same(read_jsonl(tmp_path / "out.jsonl"), [e for s in run.events for e in s])
    # one run directory per exported run, named after the run's folder (not its id)
    assert [p.name for p in (tmp_path / "tb").iterdir()] == ["run"]
    acc = ea.EventAccumulator(str(tmp_path / "tb" / "run"), size_guidance={ea.HISTOGRAMS: 0})
    acc.Reload()
    hist = [e for s in run.events for e in s if e.kind is EventKind.HISTOGRAM_COUNTS]
    group = {"activation": "act", "gradient": "grad"}
    for e in hist:
        tag = f"{group[e.stream.value]}/{e.site}"
        (h,) = [h for h in acc.Histograms(tag) if h.step == e.optimizer_step]
        assert h.histogram_value.num == e.histogram.stats().finite
        assert h.histogram_value.sum_squares == e.histogram.stats().sum_squares
    assert list((tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))


def _tb_scalar_steps(run_dir, tag):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(run_dir), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return [s.step for s in acc.Scalars(tag)]


def test_re_export_refuses_unless_overwrite_and_never_doubles_a_series(ev, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    ev.train(tmp_path / "run", n_steps=3)
    args = ["export", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")]
    assert main(args) == 0
    run_dir = tmp_path / "tb" / "run"
    assert _tb_scalar_steps(run_dir, "loss") == [0, 1, 2]
    capsys.readouterr()
    assert main(args) == 0  # the same export again writes nothing (it would double every series)
    assert "already holds this export" in capsys.readouterr().out
    assert _tb_scalar_steps(run_dir, "loss") == [0, 1, 2]
    assert main([*args, "--axis", "epoch"]) == 3  # another export of it is refused
    assert "export_exists" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert _tb_scalar_steps(run_dir, "loss") == [0, 1, 2]  # replaced, not appended


def test_export_prints_progress_per_step(ev, tmp_path, capsys):
    ev.train(tmp_path / "run", n_steps=4)
    assert main(["export", str(tmp_path / "run"), "--jsonl", str(tmp_path / "e.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "export run [" in err and "4/4" in err and "step/s" in err
    calls = []
    export_run(
        tmp_path / "run", jsonl=tmp_path / "f.jsonl", progress=lambda d, t: calls.append((d, t))
    )
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


KILLED_WRITER = """
import os, sys, torch
from stepscope.history import HistoryWriter, ObservationBatch, RunRecord, StepBlockRecord
from stepscope.stats import reduce_spines
w = HistoryWriter(sys.argv[1], RunRecord.new(run_id="killed"), commit_steps=2, commit_seconds=None)
site = w.register_site("fc", "torch.nn.Linear", "f32")
spine = reduce_spines([torch.zeros(4)]).numpy()  # a dead layer: four exact zeros
for step in range(5):
    w.write_step(
        StepBlockRecord(step, examples_seen=8 * (step + 1)),
        [ObservationBatch.observed("activation", "forward", [site], spine)],
        scalars={"loss": 1.0 / (step + 1)},
    )
os._exit(0)  # die like a killed process: no close(), no cleanup, no atexit
"""


def test_export_of_a_killed_run_sends_its_committed_steps(tmp_path):
    subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path / "run")], check=True)
    # steps 0-3 were committed (commit_steps=2); step 4 was pending and died with the process
    report = export_run(tmp_path / "run", jsonl=tmp_path / "k.jsonl")
    events = read_jsonl(tmp_path / "k.jsonl")
    assert report.run_id == "killed"
    assert report.steps == 4 and sorted({e.optimizer_step for e in events}) == [0, 1, 2, 3]
    zero = [e for e in events if e.name == "activation.forward/fc/zero_fraction"]
    assert [e.value for e in zero] == [1.0] * 4
    assert [e.examples_seen for e in zero] == [8, 16, 24, 32]
    assert [e.value for e in events if e.name == "loss"] == [1.0, 0.5, 1 / 3, 0.25]
    assert report.axis == "all"  # JSONL lines carry every axis


def test_scalar_without_a_step_block_gets_unknown_axes_not_zero(tmp_path, ev):
    w = HistoryWriter(tmp_path / "run", ev.fixed_run_record(), commit_steps=1)
    w.write_step(StepBlockRecord(0, examples_seen=10, epoch=0), scalars={"loss": 2.0})
    w.write_scalar("eval/acc", 7, 0.5)  # an eval metric logged between steps
    w.close()
    (s0, s7) = list(step_events(tmp_path / "run"))
    assert [(e.name, e.examples_seen) for e in s0] == [("loss", 10)]
    assert [(e.name, e.optimizer_step, e.examples_seen, e.epoch) for e in s7] == [
        ("eval/acc", 7, None, None)
    ]


def test_export_refuses_without_outputs_or_artifact(tmp_path, capsys):
    with pytest.raises(Refusal) as err:
        export_run(tmp_path, jsonl=None)
    assert err.value.code == "settings_invalid"
    assert main(["export", str(tmp_path / "nope"), "--jsonl", str(tmp_path / "x.jsonl")]) == 3
    assert "history_artifact_missing" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize(
    ("keyword", "kind"),
    [("tensorboard", "file"), ("wandb", "file"), ("jsonl", "folder")],
)
def test_export_run_refuses_a_destination_of_the_wrong_kind_before_writing(keyword, kind, tmp_path):
    """The Python API refuses as the CLI does (a raw OSError once came out mid-export), names
    the keyword to use, and leaves the wrong-kind path as it was."""
    run = sample_run(str(tmp_path / "run"))
    dest = tmp_path / "dest"
    if kind == "file":
        dest.write_text("not a folder")
    else:
        dest.mkdir()
    with pytest.raises(Refusal) as err:
        export_run(run, **{keyword: str(dest)})
    assert err.value.code == "export_destination_invalid"
    assert f"{keyword}=" in str(err.value) and "Remedies" in str(err.value)
    if kind == "file":
        assert dest.read_text() == "not a folder"
    else:
        assert list(dest.iterdir()) == []

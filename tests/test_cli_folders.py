"""Every command that reads runs takes a folder of runs, searched like ``tensorboard --logdir``.

The runs are real artifacts (written by :class:`~stepscope.history.HistoryWriter`); what the
commands print is checked against the reader's own view of each run found under the folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stepscope import open_run
from stepscope.cli import main
from stepscope.events import run_name
from stepscope.history import HistoryWriter, ObservationBatch, RunRecord, StepBlockRecord, find_runs
from stepscope.history.cli import show_payload


def _spines(step: int, n_sites: int) -> np.ndarray:
    from stepscope.stats import SPINE_FIELDS

    rng = np.random.default_rng(step)
    rows = np.full((n_sites, len(SPINE_FIELDS)), np.nan)
    for i in range(n_sites):
        x = rng.normal(size=5)
        values = {"total": 5, "finite": 5, "zero": 0, "nan": 0, "posinf": 0, "neginf": 0}
        values |= {"negative": (x < 0).sum(), "sum": x.sum(), "sum_squares": (x * x).sum()}
        values |= {"sum_abs": np.abs(x).sum(), "min": x.min(), "max": x.max()}
        values |= {"absmax": np.abs(x).max(), "mean": x.mean(), "m2": ((x - x.mean()) ** 2).sum()}
        rows[i] = [values.get(f, np.nan) for f in SPINE_FIELDS]
    return rows


def _run(path: Path, n_steps: int, run: RunRecord | None = None) -> Path:
    with HistoryWriter(path, run or RunRecord.new(run_id=path.name), commit_steps=2) as w:
        ids = [w.register_site(f"s{i}", "torch.nn.Linear", "f32[5]") for i in range(2)]
        for step in range(n_steps):
            batch = ObservationBatch.observed("activation", "forward", ids, _spines(step, 2))
            w.write_step(StepBlockRecord(step), [batch])
            w.write_scalar("train/loss", step, 1.0 / (step + 1))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for name, n in (("exp/version_0", 3), ("exp/version_1", 5), ("zeta", 4)):
        _run(root / name, n, RunRecord.new(run_id=name.replace("/", "-")))
    (root / "notes").mkdir()
    return root


def test_show_of_a_folder_lists_every_run_as_the_reader_sees_it(folder, capsys):
    assert main(["show", str(folder)]) == 0
    out = capsys.readouterr().out
    runs = find_runs(folder)
    assert out.startswith(f"3 run(s) under {folder}")
    for run in runs:
        h = open_run(run)
        line = next(ln for ln in out.splitlines() if ln.startswith(str(run) + " "))
        steps = h.steps
        assert f"{len(steps)} ({steps[0]}..{steps[-1]})" in line and h.run.run_id in line
    assert main(["show", str(folder), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["path"] == str(folder)
    assert payload["runs"] == [json.loads(json.dumps(show_payload(open_run(r)))) for r in runs]
    # a run directory is shown as before: one run in full
    assert main(["show", str(runs[0]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]["run_id"] == "exp-version_0"


def test_verify_of_a_folder_checks_every_run_and_names_the_damaged_one(folder, capsys):
    assert main(["verify", str(folder)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("all 3 runs ok")
    damaged = folder / "exp" / "version_1"
    name = open_run(damaged).commits[-1]["files"][-1]["name"]
    chunk = damaged / "chunks" / name
    raw = bytearray(chunk.read_bytes())
    raw[-1] ^= 0x10
    chunk.write_bytes(bytes(raw))
    assert main(["verify", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f"1 of 3 runs FAILED: {damaged}" in out
    block = out.split(f"{damaged}:", 1)[1].split(f"{folder / 'zeta'}:", 1)[0]
    assert f"FAIL {name}" in block and out.count("FAIL ") == 1


def test_a_folder_holding_no_run_refuses_with_the_spelling_to_use(tmp_path, capsys):
    (tmp_path / "empty" / "deeper").mkdir(parents=True)
    for command in ("show", "verify", "export"):
        extra = ["--jsonl", str(tmp_path / "x.jsonl")] if command == "export" else []
        assert main([command, str(tmp_path / "empty"), *extra]) == 3
        err = capsys.readouterr().err
        assert "refused [history_artifact_missing]" in err and "holds no stepscope run" in err
        assert f"`stepscope {command} runs/demo`" in err
    assert not (tmp_path / "x.jsonl").exists()


def test_merge_takes_the_folder_holding_the_ranks(tmp_path, capsys):
    for rank in range(2):
        _run(tmp_path / "ddp" / f"rank{rank:03d}", 4, RunRecord.new("x", rank=rank, world_size=2))
    listed = [str(tmp_path / "ddp" / f"rank{r:03d}") for r in range(2)]
    assert main(["merge", *listed, "--out", str(tmp_path / "by-list")]) == 0
    assert main(["merge", str(tmp_path / "ddp"), "--out", str(tmp_path / "by-folder")]) == 0
    a, b = open_run(tmp_path / "by-list"), open_run(tmp_path / "by-folder")
    assert (a.run.run_id, a.run.world_size) == (b.run.run_id, b.run.world_size)
    np.testing.assert_array_equal(a.steps, b.steps)
    for table in ("observations", "scalars"):
        ta, tb = a.table(table), b.table(table)
        assert ta.dtype.names == tb.dtype.names
        for field in ta.dtype.names:
            np.testing.assert_array_equal(ta[field], tb[field])


def _events(log_dir: Path) -> dict[str, int]:
    """Bytes of every TensorBoard event file under ``log_dir``, by relative path."""
    return {
        p.relative_to(log_dir).as_posix(): p.stat().st_size
        for p in log_dir.rglob("events.out.tfevents.*")
    }


def test_export_of_a_folder_writes_each_run_once_however_often_it_is_run(folder, tmp_path, capsys):
    tb, jsonl = tmp_path / "tb", tmp_path / "out.jsonl"
    assert main(["export", str(folder), "--tensorboard", str(tb), "--jsonl", str(jsonl)]) == 0
    runs = find_runs(folder)
    written = _events(tb)
    # each run in the folder named after its directory (a version keeps its parent's name)
    assert sorted({k.rsplit("/", 1)[0] for k in written}) == sorted(
        run_name(open_run(r).run, r) for r in runs
    )
    for run in runs:  # one JSONL file per run: out.<run>.jsonl, every committed step in it
        rel = run.relative_to(folder).as_posix().replace("/", ".")
        lines = (tmp_path / f"out.{rel}.jsonl").read_text().splitlines()
        steps = {json.loads(ln).get("optimizer_step") for ln in lines}
        assert set(open_run(run).steps.tolist()) <= steps
    capsys.readouterr()
    # again: nothing is written twice (the series would double), and it is not a refusal
    assert main(["export", str(folder), "--tensorboard", str(tb), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("already holds this export") == 3 and _events(tb) == written
    # other options make another export: the old one is not silently doubled
    assert main(["export", str(folder), "--tensorboard", str(tb), "--axis", "epoch"]) == 3
    assert "export_exists" in capsys.readouterr().err

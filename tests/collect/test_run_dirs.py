"""Runs never collide: versions, exact directories, the disk default (no RAM ring limit).

Each test runs real collectors (no hand-made artifacts) and reads back what they wrote.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import stepscope as ss
from stepscope.history import find_runs

ENV_ROOT = "STEPSCOPE_DIR"  # stepscope.history.versions.ENV_ROOT (checked below)

REPO = Path(__file__).resolve().parents[2]


def _train(settings: ss.WatchSettings | None, steps: int = 3) -> ss.HistoryCollector:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ss.HistoryCollector(model, sites="*", settings=settings) as c:
        for _ in range(steps):
            with c.step(opt, examples=4):
                opt.zero_grad()
                model(torch.randn(4, 4)).pow(2).mean().backward()
                opt.step()
    return c


SCRIPT = """
import torch, stepscope as ss
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with ss.HistoryCollector(model, settings=ss.WatchSettings(name="demo")) as c:
    for _ in range(2):
        with c.step(opt, examples=2):
            model(torch.randn(2, 3)).sum().backward(); opt.step(); opt.zero_grad()
print(c.run_dir)
"""


def test_running_the_same_script_twice_writes_two_versions(tmp_path):
    """The script a newcomer writes, run twice in one folder: two versions, both readable."""
    env = {k: v for k, v in os.environ.items() if k != ENV_ROOT}  # the real default: ./runs
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    printed = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        printed.append(out.stdout.strip())
    assert printed == [
        str(Path("runs", "demo", "version_0")),
        str(Path("runs", "demo", "version_1")),
    ]
    runs = find_runs(tmp_path / "runs")
    assert [p.relative_to(tmp_path).as_posix() for p in runs] == [
        "runs/demo/version_0",
        "runs/demo/version_1",
    ]
    assert [ss.open_run(p).steps.tolist() for p in runs] == [[0, 1], [0, 1]]
    # the folder a user naturally has opens its newest version
    assert ss.open_run(tmp_path / "runs" / "demo").path == tmp_path / "runs/demo/version_1"


def test_the_default_root_is_stepscope_dir_and_every_collector_gets_a_version(
    tmp_path, monkeypatch
):
    monkeypatch.setenv(ENV_ROOT, str(tmp_path / "root"))
    dirs = [_train(None).run_dir, _train(ss.WatchSettings()).run_dir]
    assert dirs == [tmp_path / "root" / "version_0", tmp_path / "root" / "version_1"]
    named = _train(ss.WatchSettings(root_dir=tmp_path / "x", name="mlp")).run_dir
    assert named == tmp_path / "x" / "mlp" / "version_0"
    assert ss.open_run(named).steps.tolist() == [0, 1, 2]


def _claim(args: tuple[str, int]) -> list[str]:
    from stepscope.history.versions import claim_version

    parent, n = args
    return [claim_version(parent).name for _ in range(n)]


def test_two_processes_claiming_at_once_never_share_a_version(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        got = pool.map(_claim, [(str(tmp_path / "p"), 15)] * 2)
    names = [n for part in got for n in part]
    assert len(names) == len(set(names)) == 30
    assert sorted(names) == sorted(f"version_{i}" for i in range(30))


def test_ranks_of_one_job_agree_on_a_version_without_talking(tmp_path):
    from stepscope.history.versions import claim_version

    first = [claim_version(tmp_path, slot=f"rank{r:03d}") for r in range(2)]
    second = [claim_version(tmp_path, slot=f"rank{r:03d}") for r in (1, 0)]
    assert first == [tmp_path / "version_0" / "rank000", tmp_path / "version_0" / "rank001"]
    assert second == [tmp_path / "version_1" / "rank001", tmp_path / "version_1" / "rank000"]
    (claim_version(tmp_path) / "manifest.json").write_text("{}")  # a one-process run: version_2
    assert claim_version(tmp_path, slot="rank000") == tmp_path / "version_3" / "rank000"


def test_an_exact_output_dir_refuses_a_second_run_naming_the_resume_spelling(tmp_path):
    run = tmp_path / "a"
    _train(ss.WatchSettings(output_dir=run))
    with pytest.raises(ss.Refusal) as err:
        _train(ss.WatchSettings(output_dir=run))
    assert err.value.code == "history_run_exists"
    spelling = f"ss.WatchSettings(output_dir={str(run)!r}, resume=True)"
    assert spelling in err.value.remedies[0]
    # the remedy, followed literally, works: the run goes on at step 3
    _train(eval(spelling, {"ss": ss}))
    assert ss.open_run(run).steps.tolist() == [0, 1, 2, 3, 4, 5]


def test_resume_without_a_directory_names_the_exact_spelling():
    with pytest.raises(ss.Refusal) as err:
        ss.WatchSettings(resume=True)
    assert "WatchSettings(output_dir='runs/<name>/version_<N>', resume=True)" in str(err.value)


def test_the_collector_says_once_where_it_writes(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="stepscope"):
        c = _train(ss.WatchSettings(root_dir=tmp_path, name="m"))
    said = [r.getMessage() for r in caplog.records if "recording run" in r.getMessage()]
    assert said == [f"recording run {c.run.run_id} to {tmp_path / 'm' / 'version_0'}"]


def test_the_default_never_stops_training_at_the_ram_rings_capacity():
    """With no output_dir, step 257 once raised ring_capacity_exhausted (a RAM-only default)."""
    c = _train(None, steps=300)
    assert c.run_dir is not None
    assert len(ss.open_run(c.run_dir).steps) == 300


def test_in_memory_is_the_explicit_ram_ring():
    c = _train(ss.WatchSettings(in_memory=True))
    assert c.path is None and len(c.ring.blocks()) == 3
    with pytest.raises(ss.Refusal) as err:
        _ = c.run_dir
    assert err.value.code == "collector_in_memory"
    with pytest.raises(ss.Refusal) as err:
        ss.WatchSettings(in_memory=True, output_dir="x")
    assert err.value.code == "settings_invalid"


def test_a_folder_of_unrelated_runs_is_refused_listing_them(tmp_path):
    for name in ("a", "b"):
        _train(ss.WatchSettings(output_dir=tmp_path / name))
    with pytest.raises(ss.Refusal) as err:
        ss.open_run(tmp_path)
    assert err.value.code == "run_ambiguous"
    assert str(tmp_path / "a") in err.value.message and str(tmp_path / "b") in err.value.message
    assert f"ss.open_run({str(tmp_path / 'b')!r})" in err.value.remedies[0]


def test_tests_never_write_runs_into_the_repository():
    root = Path(os.environ[ENV_ROOT]).resolve()
    assert REPO not in root.parents
    assert _train(None).run_dir.resolve().parent == root


def test_the_conftest_sets_the_variable_stepscope_reads():
    from stepscope.history import versions
    from tests import conftest

    assert conftest.ENV_ROOT == ENV_ROOT == versions.ENV_ROOT

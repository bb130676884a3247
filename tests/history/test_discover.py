"""find_runs: the one rule for what a folder of runs holds (against real artifacts)."""

from __future__ import annotations

from pathlib import Path

from stepscope.history import HistoryWriter, RunRecord, find_runs, is_run_dir


def _write_run(path: Path) -> None:
    with HistoryWriter(path, RunRecord.new()) as writer:
        writer.write_scalar("loss", 0, 1.0)


def test_find_runs_walks_a_folder_of_real_runs(tmp_path: Path) -> None:
    for name in ("z", "exp/version_1", "exp/version_0"):
        _write_run(tmp_path / name)
    (tmp_path / "empty").mkdir()
    found = find_runs(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "exp/version_0",
        "exp/version_1",
        "z",
    ]
    assert all(is_run_dir(p) for p in found)
    # a run's own chunks/ folder is never searched; a run directory is its own only run
    assert find_runs(tmp_path / "z") == [tmp_path / "z"]
    assert find_runs(tmp_path / "empty") == []
    assert find_runs(tmp_path / "missing") == []
    assert not is_run_dir(tmp_path / "exp")


def test_find_runs_does_not_follow_links(tmp_path: Path) -> None:
    _write_run(tmp_path / "outside" / "r")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "outside", target_is_directory=True)
    assert find_runs(tmp_path / "root") == []

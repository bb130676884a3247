"""``runlog.json`` is signed: an edited summary never reaches the overhead table or clocks()."""

import json

import pytest

from stepscope.errors import Refusal
from stepscope.run import open_run
from stepscope.runlog import RunLog
from stepscope.runlog.sink import read_summary


def _run(path):
    r = RunLog(path)
    for _ in range(3):
        with r.step():
            r.log("loss", 1.0)
    r.close()
    return path


def test_an_untouched_summary_reads_back_and_verifies(tmp_path):
    path = _run(tmp_path / "run")
    on_disk = json.loads((path / "runlog.json").read_text())
    summary = read_summary(path)
    assert "sha256" not in summary and summary == {
        k: v for k, v in on_disk.items() if k != "sha256"
    }
    assert open_run(path).verify().ok


@pytest.mark.parametrize("edit", ["number", "unsigned", "resigned_badly"])
def test_an_edited_summary_refuses_and_verify_reports_it(tmp_path, edit):
    path = _run(tmp_path / "run")
    d = json.loads((path / "runlog.json").read_text())
    if edit == "number":
        d["training_seconds"] = 1e9  # what an overhead table would have shown
    elif edit == "unsigned":
        d.pop("sha256")
    else:
        d["sha256"] = "0" * 64
    (path / "runlog.json").write_text(json.dumps(d))
    with pytest.raises(Refusal) as err:
        read_summary(path)
    assert err.value.code == "history_artifact_corrupt"
    report = open_run(path).verify()
    assert ("runlog.json", "history_artifact_corrupt") in {(n, c) for n, c, _ in report.failures}
    with pytest.raises(Refusal):
        open_run(path).clocks()

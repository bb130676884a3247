"""Self-contradictory artifacts (every checksum re-signed by the forger) are never read as data.

Each mutant below keeps every sha256 valid (the log rows are re-signed, ``index.json`` re-sealed
and re-signed) but makes the artifact contradict itself. Reading must refuse
``history_artifact_inconsistent``, ``verify()`` must list the inconsistency and
``stepscope verify`` must exit 1. The oracle is the unmutated run, read back first.
"""

import hashlib
import json

import numpy as np
import pytest

from stepscope import open_run
from stepscope.cli import main
from stepscope.errors import Refusal
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.files import encode_log_row, json_sha256, log_extent
from stepscope.stats.layout import FIELD_INDEX


def _run(path):
    with HistoryWriter(path, commit_steps=2, commit_seconds=None) as w:
        ids = [w.register_site("fc", "t", "x"), w.register_site("out", "t", "x")]
        for step in range(4):
            spine = np.zeros((2, 15))
            spine[:, :2] = 3
            spine[:, FIELD_INDEX["mean"]] = step
            grad = spine.copy()
            grad[:, FIELD_INDEX["mean"]] = -step
            w.write_step(
                StepBlockRecord(step),
                [
                    ObservationBatch.observed("activation", "forward", ids, spine),
                    ObservationBatch.observed(
                        "gradient", "backward", ids, grad, scale_grad="unscaled"
                    ),
                ],
            )
    h = open_run(path)
    assert h.steps.tolist() == [0, 1, 2, 3] and h.verify().ok  # the honest run
    return path


def _reseal(run, mutate):
    """Apply ``mutate(rows, chunks_dir)`` to the log rows, re-sign them and re-seal index.json."""
    log = next((run / "index").glob("*.log"))
    rows = [json.loads(line.split(b" ", 1)[1]) for line in log.read_bytes().splitlines()]
    mutate(rows, run / "chunks")
    log.write_bytes(b"".join(encode_log_row(r) for r in rows))
    index = json.loads((run / "index.json").read_text())
    index.pop("sha256")
    index["sealed"][f"index/{log.name}"] = log_extent(log)
    index["sha256"] = json_sha256(index)
    (run / "index.json").write_text(json.dumps(index))


def _file(row, table, stream=None):
    return next(f for f in row["files"] if f["table"] == table and f["stream"] == stream)


def _repeat_renumbered(rows, chunks):
    rows.append({**rows[1], "seq": len(rows)})  # commit 1 again, as a new last commit


def _relabel_stream(rows, chunks):
    a, g = _file(rows[0], "observations", "activation"), _file(rows[0], "observations", "gradient")
    a["stream"], g["stream"] = "gradient", "activation"


def _relabel_stream_and_rename(rows, chunks):
    a, g = _file(rows[0], "observations", "activation"), _file(rows[0], "observations", "gradient")
    (chunks / a["name"]).rename(chunks / "tmp")
    (chunks / g["name"]).rename(chunks / a["name"])
    (chunks / "tmp").rename(chunks / g["name"])
    for f in (a, g):
        data = (chunks / f["name"]).read_bytes()
        f.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


def _swap_commits_entries(rows, chunks):
    a, b = (
        _file(rows[0], "observations", "activation"),
        _file(rows[1], "observations", "activation"),
    )
    keys = ("name", "sha256", "bytes", "rows", "site_lo", "site_hi")
    va, vb = {k: a[k] for k in keys}, {k: b[k] for k in keys}
    a.update(vb)
    b.update(va)


def _swap_commits_files(rows, chunks):
    for table, stream in (("steps", None), ("observations", "activation")):
        a, b = _file(rows[0], table, stream), _file(rows[1], table, stream)
        (chunks / a["name"]).rename(chunks / "tmp")
        (chunks / b["name"]).rename(chunks / a["name"])
        (chunks / "tmp").rename(chunks / b["name"])
        a["sha256"], b["sha256"] = b["sha256"], a["sha256"]
        a["bytes"], b["bytes"] = b["bytes"], a["bytes"]


MUTANTS = {
    "row_repeated_seq_renumbered": _repeat_renumbered,
    "stream_relabelled": _relabel_stream,
    "stream_relabelled_files_renamed": _relabel_stream_and_rename,
    "commits_entries_swapped": _swap_commits_entries,
    "commits_chunks_swapped": _swap_commits_files,
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_a_resigned_self_contradictory_artifact_is_refused_and_verify_reports_it(
    tmp_path, capsys, name
):
    run = _run(tmp_path / "run")
    _reseal(run, MUTANTS[name])
    h = open_run(run)  # the checksums all hold: it opens
    with pytest.raises(Refusal) as err:
        h.steps.tolist()
        h.series("fc", "gradient", "mean")
        h.series("fc", "activation", "mean")
        h.table("steps", steps=(0, 1))
    assert err.value.code == "history_artifact_inconsistent", err.value
    report = open_run(run).verify()
    assert not report.ok
    assert "history_artifact_inconsistent" in {code for _, code, _ in report.failures}
    assert main(["verify", str(run)]) == 1
    assert "history_artifact_inconsistent" in capsys.readouterr().out

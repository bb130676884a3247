"""Files a reader cannot read (another user's run, a FIFO, a link to /dev/zero, bad JSON) refuse
with a code; nothing raw, nothing hangs, nothing outside the run is followed."""

import json
import os
import pathlib

import numpy as np
import pytest

from stepscope import open_run
from stepscope.errors import Refusal
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord


def _run(path):
    with HistoryWriter(path) as w:
        ids = [w.register_site("fc", "t", "x")]
        spine = np.zeros((1, 15))
        spine[0, :2] = 1
        w.write_step(
            StepBlockRecord(0), [ObservationBatch.observed("activation", "forward", ids, spine)]
        )
    return path


def test_an_unlistable_chunk_directory_is_a_verify_failure_not_a_raw_error(tmp_path, monkeypatch):
    path = _run(tmp_path / "run")
    h = open_run(path)
    real = pathlib.Path.iterdir

    def iterdir(self):  # as for a non-root reader of a chunks/ without read permission
        if self.name == "chunks":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "iterdir", iterdir)
    report = h.verify()
    assert not report.ok
    assert {c for _, c, _ in report.failures} == {"history_artifact_missing"}


TELEMETRY = {
    "bad_json": lambda p: p.write_text("{"),
    "a_list": lambda p: p.write_text("[1, 2]"),
    "a_directory": lambda p: p.mkdir(),
    "not_utf8": lambda p: p.write_bytes(b'{"a": "\xff"}'),
    "a_fifo": lambda p: os.mkfifo(p),
    "link_to_dev_zero": lambda p: os.symlink("/dev/zero", p),
    "link_outside": lambda p: [
        (p.parent.parent / "secret.json").write_text('{"a": 1}'),
        os.symlink(p.parent.parent / "secret.json", p),
    ],
}


@pytest.mark.parametrize("kind", list(TELEMETRY))
def test_a_hostile_telemetry_json_refuses_with_a_code(tmp_path, kind):
    from stepscope.report.record import _telemetry_accounting

    path = _run(tmp_path / "run")
    TELEMETRY[kind](path / "telemetry.json")
    with pytest.raises(Refusal) as err:
        _telemetry_accounting(open_run(path))
    assert err.value.code in {"history_json_invalid", "history_file_kind_invalid"}, err.value


def test_a_plain_telemetry_json_is_still_shown(tmp_path):
    from stepscope.report.record import _telemetry_accounting

    path = _run(tmp_path / "run")
    (path / "telemetry.json").write_text(json.dumps({"probe_seconds": 0.5}))
    table = _telemetry_accounting(open_run(path))
    assert ["probe_seconds", "0.5"] in [list(r) for r in table.rows]

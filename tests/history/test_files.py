import os

import numpy as np
import pytest

from stepscope import Refusal, open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.files import (
    append_log_row,
    atomic_write_bytes,
    check_name,
    encode_log_row,
    read_json,
    read_log,
)
from stepscope.stats import SPINE_WIDTH


def test_log_rows_round_trip_and_a_torn_tail_is_ignored(tmp_path):
    log = tmp_path / "a.log"
    for i in range(3):
        append_log_row(log, {"seq": i})
    full = log.read_bytes()
    tail = encode_log_row({"seq": 3})
    for cut in range(1, len(tail)):  # every possible torn append
        log.write_bytes(full + tail[:cut])
        got = read_log(log)
        assert [r["seq"] for r in got.rows] == [0, 1, 2]
        assert got.torn_tail_bytes == cut


def test_a_complete_log_row_failing_its_checksum_refuses_corrupt(tmp_path):
    log = tmp_path / "a.log"
    for i in range(3):
        append_log_row(log, {"seq": i})
    raw = bytearray(log.read_bytes())
    raw[raw.index(b'"seq":1') + 6] = ord("7")  # committed row 1 now says seq 7
    log.write_bytes(bytes(raw))
    with pytest.raises(Refusal) as err:
        read_log(log)
    assert err.value.code == "history_artifact_corrupt"


def test_incremental_log_reads_resume_from_the_offset(tmp_path):
    log = tmp_path / "a.log"
    append_log_row(log, {"seq": 0})
    first = read_log(log)
    append_log_row(log, {"seq": 1})
    second = read_log(log, first.next_offset)
    assert [r["seq"] for r in second.rows] == [1]
    assert read_log(tmp_path / "never.log", missing_ok=True).rows == []
    with pytest.raises(Refusal) as err:  # a log that index.json names always exists
        read_log(tmp_path / "never.log")
    assert err.value.code == "history_artifact_missing"


def _live_run(run_dir, n_steps, commit_steps):
    """A run whose writer never closed (as after a kill): its log is not sealed."""
    w = HistoryWriter(run_dir, commit_steps=commit_steps, commit_seconds=None)
    ids = [w.register_site("s0", "torch.nn.Linear", "f32[7]")]
    for step in range(n_steps):
        w.write_step(
            StepBlockRecord(step),
            [ObservationBatch.observed("activation", "forward", ids, np.ones((1, SPINE_WIDTH)))],
        )
    w._unlock()
    return w


def test_torn_tail_in_a_live_artifact_opens_to_the_last_commit(run_dir):
    _live_run(run_dir, n_steps=6, commit_steps=2)
    log = next((run_dir / "index").glob("*.log"))
    raw = log.read_bytes()
    last_start = raw.rstrip(b"\n").rfind(b"\n") + 1
    log.write_bytes(raw[: last_start + 40])  # the last commit's line was cut mid-append
    h = open_run(run_dir)
    assert h.steps.tolist() == [0, 1, 2, 3] and h.torn_tail_bytes == 40
    assert h.verify().ok


def test_a_cut_in_a_sealed_log_refuses_incomplete(run_dir, hx):
    hx.write_simple_run(run_dir, n_steps=6, commit_steps=2)  # closed: the log is sealed
    log = next((run_dir / "index").glob("*.log"))
    raw = log.read_bytes()
    last_start = raw.rstrip(b"\n").rfind(b"\n") + 1
    for cut in (last_start + 40, last_start):  # mid-line, and after a whole line
        log.write_bytes(raw[:cut])
        with pytest.raises(Refusal) as err:
            open_run(run_dir)
        assert err.value.code == "history_index_incomplete"


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path):
    target = tmp_path / "x.json"
    atomic_write_bytes(target, b'{"a": 1}')
    atomic_write_bytes(target, b'{"a": 2}')
    assert read_json(target, "x") == {"a": 2}
    assert os.listdir(tmp_path) == ["x.json"]


@pytest.mark.parametrize("name", ["../a.npy", "a/b.npy", "", ".hidden", "a\\b", 7, None, "x" * 300])
def test_check_name_refuses_anything_but_plain_names(name):
    with pytest.raises(Refusal) as err:
        check_name(name, "test")
    assert err.value.code == "history_chunk_name_invalid"
    assert check_name("seg-0000001-observations-activation.npy", "t").endswith(".npy")

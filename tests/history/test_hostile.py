"""Hostile artifacts: swapped file kinds, links, crafted values. Correct data or a coded Refusal.

Each case is a mutation an adversarial run found raising a raw exception, hanging or allocating
far beyond the file; here each must refuse with a code, quickly, or read the unchanged data.
"""

import hashlib
import io
import json
import os
import shutil

import numpy as np
import pytest

from stepscope import Refusal
from stepscope.cli import main
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.files import encode_log_row, json_sha256, log_extent
from stepscope.run import open_run  # the reader with the run log's evals.log
from stepscope.stats import SPINE_WIDTH


def _run(path):
    with HistoryWriter(path, commit_steps=2, commit_seconds=None) as w:
        ids = [w.register_site(f"s{i}", "torch.nn.Linear", "f32[7]") for i in range(2)]
        for step in range(4):
            spines = np.zeros((2, SPINE_WIDTH))
            spines[:, :2] = 7
            b = ObservationBatch.observed("activation", "forward", ids, spines)
            w.write_step(StepBlockRecord(step), [b], scalars={"loss": float(step)})
    return path


def _read_everything(h):
    assert len(h.steps) >= 0
    h.step_blocks()
    for s in h.sites:
        h.observations(s.site_id)
    for name in h.scalar_names:
        h.scalars(name)
    h.evals()
    return h


def _refuses(path, code=None):
    with pytest.raises(Refusal) as err:
        _read_everything(open_run(path))
    if code is not None:
        assert err.value.code == code, err.value
    return err.value


def _reseal(run_dir, mutate_rows=None, mutate_index=None):
    """Rewrite the log rows (re-signed) and index.json (re-sealed, re-signed): a forger's edit."""
    log = next((run_dir / "index").glob("*.log"))
    rows = [json.loads(line.split(b" ", 1)[1]) for line in log.read_bytes().splitlines()]
    if mutate_rows is not None:
        mutate_rows(rows)
    log.write_bytes(b"".join(encode_log_row(r) for r in rows))
    index = json.loads((run_dir / "index.json").read_text())
    index.pop("sha256")
    index["sealed"][f"index/{log.name}"] = log_extent(log)
    index["manifest_sha256"] = hashlib.sha256((run_dir / "manifest.json").read_bytes()).hexdigest()
    index["catalog_sha256"] = hashlib.sha256((run_dir / "catalog.json").read_bytes()).hexdigest()
    if mutate_index is not None:
        mutate_index(index)
    index["sha256"] = json_sha256(index)
    (run_dir / "index.json").write_text(json.dumps(index))


def _chunk(run_dir, table):
    return next(p for p in (run_dir / "chunks").iterdir() if f"-{table}" in p.name)


def _replace_chunk(run_dir, table, data):
    """Replace a chunk's bytes and re-sign its index entry (a crafted, self-consistent chunk)."""
    path = _chunk(run_dir, table)
    path.write_bytes(data)

    def mutate(rows):
        for r in rows:
            for f in r["files"]:
                if f["name"] == path.name:
                    f["sha256"] = hashlib.sha256(data).hexdigest()
                    f["bytes"] = len(data)

    _reseal(run_dir, mutate)


# -- the index layer ---------------------------------------------------------------------------
def test_a_bit_flip_in_the_log_name_inside_index_json_refuses(tmp_path):
    run = _run(tmp_path / "run")
    raw = (run / "index.json").read_bytes()
    pos = raw.index(b"index/") + 8
    (run / "index.json").write_bytes(raw[:pos] + bytes([raw[pos] ^ 1]) + raw[pos + 1 :])
    _refuses(run, "history_artifact_corrupt")
    assert main(["verify", str(run)]) != 0


@pytest.mark.parametrize("cut", ["after_line", "mid_line", "empty"])
def test_a_shortened_index_log_refuses_and_verify_fails(tmp_path, cut):
    run = _run(tmp_path / "run")
    log = next((run / "index").glob("*.log"))
    raw = log.read_bytes()
    first = raw.index(b"\n") + 1
    log.write_bytes({"after_line": raw[:first], "mid_line": raw[: first + 20], "empty": b""}[cut])
    _refuses(run, "history_index_incomplete")
    assert main(["verify", str(run)]) != 0


def test_a_deleted_index_directory_refuses(tmp_path):
    run = _run(tmp_path / "run")
    shutil.rmtree(run / "index")
    _refuses(run, "history_artifact_missing")
    assert main(["verify", str(run)]) != 0


def test_a_middle_row_deleted_from_a_killed_runs_log_is_located(tmp_path):
    run = tmp_path / "run"
    w = HistoryWriter(run, commit_steps=1, commit_seconds=None)
    ids = [w.register_site("s0", "t", "sig")]
    for step in range(5):
        b = ObservationBatch.observed("activation", "forward", ids, np.ones((1, SPINE_WIDTH)))
        w.write_step(StepBlockRecord(step), [b])
    w._unlock()  # never closed: not sealed, as after a kill
    log = next((run / "index").glob("*.log"))
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:2] + lines[3:]))
    err = _refuses(run, "history_index_incomplete")
    assert "row 3" in err.message
    log.write_bytes(b"".join(lines[:3]))  # cut after a line: later chunks prove it
    _refuses(run, "history_index_incomplete")


def test_a_deleted_or_truncated_evals_log_of_a_closed_run_refuses(tmp_path):
    import stepscope as ss

    path = tmp_path / "run"
    with ss.RunLog(path, commit_steps=2) as log:
        for step in range(4):
            log.log("loss", float(step))
            log.log_eval("validation", {"ce": float(step)})
            log.step()
    assert len(open_run(path).evals("validation")) == 4
    raw = (path / "evals.log").read_bytes()
    (path / "evals.log").write_bytes(raw[: raw.index(b"\n") + 1])
    _refuses(path, "history_index_incomplete")
    (path / "evals.log").unlink()
    _refuses(path, "history_index_incomplete")


def test_a_torn_evals_log_append_does_not_poison_later_evaluations(tmp_path):
    import stepscope as ss

    path = tmp_path / "run"
    with ss.RunLog(path, commit_steps=2) as log:
        for step in range(14):
            log.log_eval("validation", {"ce": float(step)})
            if step == 6:
                with open(path / "evals.log", "ab") as fh:  # a torn append (disk full)
                    fh.write(b'0123abcd {"split": "valid')
            log.step()
    assert [r.metrics["ce"] for r in open_run(path).evals("validation")] == [
        float(s) for s in range(14)
    ]


# -- file kinds and links ----------------------------------------------------------------------
def _swap(run, rel, kind):
    target = run / rel
    if target.is_dir():
        shutil.rmtree(target)
    elif os.path.lexists(target):
        target.unlink()
    if kind == "dir":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "file":
        target.write_bytes(b"x")
    elif kind == "loop":
        os.symlink(target.name, target)
    else:
        os.symlink(kind, target)


@pytest.mark.parametrize(
    "rel, kind",
    [
        ("manifest.json", "fifo"),
        ("manifest.json", "/dev/zero"),
        ("manifest.json", "/dev/urandom"),
        ("manifest.json", "dir"),
        ("index.json", "loop"),
        ("catalog.json", "/dev/zero"),
        ("chunks", "file"),
        ("chunks", "loop"),
        ("index", "file"),
        ("CHUNK", "dir"),
        ("CHUNK", "fifo"),
        ("CHUNK", "/dev/zero"),
        ("CHUNK", "loop"),
        ("LOG", "dir"),
        ("LOG", "fifo"),
        ("LOG", "/dev/urandom"),
        ("evals.log", "dir"),
        ("evals.log", "fifo"),
    ],
)
def test_swapped_file_kinds_refuse_with_a_code_never_hang(tmp_path, rel, kind):
    run = _run(tmp_path / "run")
    if rel == "CHUNK":
        rel = "chunks/" + _chunk(run, "observations").name
    if rel == "LOG":
        rel = "index/" + next((run / "index").glob("*.log")).name
    _swap(run, rel, kind)
    _refuses(run)
    assert main(["verify", str(run)]) != 0  # never a raw exception, never exit 0


def test_a_chunk_symlinked_out_of_the_run_refuses_even_with_the_right_bytes(tmp_path):
    run = _run(tmp_path / "run")
    chunk = _chunk(run, "observations")
    outside = tmp_path / "outside.npy"
    outside.write_bytes(chunk.read_bytes())
    chunk.unlink()
    os.symlink(outside, chunk)
    _refuses(run, "history_file_kind_invalid")
    assert not open_run(run).verify().ok


def test_verify_with_chunks_deleted_reports_instead_of_raising(tmp_path, capsys):
    run = _run(tmp_path / "run")
    shutil.rmtree(run / "chunks")
    assert main(["verify", str(run)]) != 0


def test_resume_never_writes_through_links_out_of_the_run(tmp_path):
    from stepscope.runlog import EvalRecord
    from stepscope.runlog.sink import DiskSink

    run = _run(tmp_path / "run")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep")
    os.symlink(outside, run / "evals.log")
    w = HistoryWriter(run, resume=True)
    rows = DiskSink(w)
    with pytest.warns(RuntimeWarning, match="history_disk_fault.*symbolic link"):
        rows.write_eval(EvalRecord("validation", {"ce": 1.0}, optimizer_step=4))
    assert len(rows.unwritten) == 1  # kept back, never written through the link
    w.close()
    assert outside.read_bytes() == b"keep"
    os.unlink(run / "evals.log")
    outside_lock = tmp_path / "lock"
    (run / "writer.lock").unlink()
    os.symlink(outside_lock, run / "writer.lock")
    with pytest.raises(Refusal) as err:
        HistoryWriter(run, resume=True)
    assert err.value.code == "history_file_kind_invalid" and not outside_lock.exists()


# -- crafted values ----------------------------------------------------------------------------
def _npy_with_header(dtype_descr, shape, body=b""):
    header = repr({"descr": dtype_descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + body


def test_an_npy_header_claiming_1e11_rows_refuses_without_allocating(tmp_path):
    run = _run(tmp_path / "run")
    h = open_run(run)
    dt = h._dtypes["observations"]
    data = _npy_with_header(np.lib.format.dtype_to_descr(dt), (10**11,), b"\0" * dt.itemsize)
    _replace_chunk(run, "observations", data)
    _refuses(run, "history_artifact_corrupt")


@pytest.mark.parametrize(
    "header",
    [b"{'descr': '<f8', 'fortran_order': False, 'shape': (3,), '''", b"\xff\xfe(((", b"[" * 5000],
)
def test_junk_npy_headers_refuse_corrupt(tmp_path, header):
    run = _run(tmp_path / "run")
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header
    _replace_chunk(run, "steps", data)
    _refuses(run, "history_artifact_corrupt")


def test_a_2d_chunk_refuses_corrupt(tmp_path):
    run = _run(tmp_path / "run")
    arr = np.load(io.BytesIO(_chunk(run, "steps").read_bytes()))
    buf = io.BytesIO()
    np.save(buf, np.stack([arr, arr]))
    _replace_chunk(run, "steps", buf.getvalue())
    _refuses(run, "history_artifact_corrupt")


def test_one_chunk_named_by_two_tables_refuses_instead_of_mixing_dtypes(tmp_path):
    run = _run(tmp_path / "run")

    def mutate(rows):
        obs = next(f for f in rows[0]["files"] if f["table"] == "observations")
        sca = next(f for f in rows[0]["files"] if f["table"] == "scalars")
        sca.update(name=obs["name"], sha256=obs["sha256"], bytes=obs["bytes"])

    _reseal(run, mutate)
    _refuses(run, "history_artifact_inconsistent")  # re-signed: the bytes hold, the names do not


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f.pop("stream"),
        lambda f: f.update(bytes=10**400),
        lambda f: f.update(rows=-1),
        lambda f: f.update(rows=float("nan")),
        lambda f: f.update(site_lo=10**30, site_hi=10**30),
    ],
    ids=["no_stream", "huge_bytes", "negative_rows", "nan_rows", "huge_sites"],
)
def test_malformed_file_entries_refuse_with_a_code(tmp_path, mutate):
    run = _run(tmp_path / "run")
    _reseal(run, lambda rows: mutate(rows[0]["files"][0]))
    _refuses(run)
    assert main(["show", str(run)]) == 3
    assert main(["verify", str(run)]) == 3


def _rewrite_observations(run, edit):
    arr = np.load(io.BytesIO(_chunk(run, "observations").read_bytes())).copy()
    edit(arr)
    buf = io.BytesIO()
    np.save(buf, arr)
    _replace_chunk(run, "observations", buf.getvalue())


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: a["disclosure"].__setitem__(slice(None), 99),
        lambda a: a["spine"].__setitem__((slice(None), 0), np.nan),
        lambda a: a["rdtype"].__setitem__(slice(None), 200),
        lambda a: a["presence"].__setitem__(slice(None), 77),
        lambda a: a["stream"].__setitem__(slice(None), 99),
    ],
    ids=["disclosure_id", "nan_count", "rdtype", "presence", "stream"],
)
def test_crafted_cell_codes_refuse_with_a_code(tmp_path, edit):
    run = _run(tmp_path / "run")
    _rewrite_observations(run, edit)
    _refuses(run)


def test_a_bad_scalar_name_id_refuses(tmp_path):
    run = _run(tmp_path / "run")
    arr = np.load(io.BytesIO(_chunk(run, "scalars").read_bytes())).copy()
    arr["name"] = 42
    buf = io.BytesIO()
    np.save(buf, arr)
    _replace_chunk(run, "scalars", buf.getvalue())

    with pytest.raises(Refusal) as err:
        _read_everything(open_run(run))
        open_run(run).view().scalar("loss")
    assert err.value.code == "history_artifact_corrupt"


def test_huge_numbers_in_the_manifest_refuse(tmp_path):
    run = _run(tmp_path / "run")
    man = json.loads((run / "manifest.json").read_text())
    for seg in [man["run"], *man["segments"]]:
        seg["created_unix"] = 10**400
    (run / "manifest.json").write_text(json.dumps(man))
    _reseal(run)
    _refuses(run, "history_json_invalid")


def test_huge_numbers_in_evals_log_refuse(tmp_path):
    import stepscope as ss

    path = tmp_path / "run"
    with ss.RunLog(path, commit_steps=2) as log:
        log.log_eval("validation", {"ce": 1.0})
        log.step()
    from stepscope.runlog import EvalRecord

    row = {
        "segment": "x",
        "n": 0,
        **EvalRecord("validation", {"ce": 1.0}, optimizer_step=0).to_dict(),
    }
    for key, value in [("optimizer_step", 10**400), ("examples_seen", 10**30)]:
        bad = {**row, key: value}
        (path / "evals.log").write_bytes(encode_log_row(bad))
        _reseal_evals(path)
        _refuses(path, "history_json_invalid")
    bad = {**row, "metrics": {"ce": 10**400}}
    (path / "evals.log").write_bytes(encode_log_row(bad))
    _reseal_evals(path)
    _refuses(path, "history_json_invalid")


def _reseal_evals(path):
    def mutate(index):
        index["sealed"]["evals.log"] = log_extent(path / "evals.log")

    _reseal(path, mutate_index=mutate)


def test_show_escapes_terminal_control_sequences_in_site_names(tmp_path, capsys):
    run = tmp_path / "run"
    with HistoryWriter(run, commit_steps=1) as w:
        ids = [w.register_site("evil\x1b]0;pwned\x07\x1b[2J", "t\nx", "sig")]
        b = ObservationBatch.observed("activation", "forward", ids, np.ones((1, SPINE_WIDTH)))
        w.write_step(StepBlockRecord(0), [b], scalars={"a\x1b[31m": 1.0})
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b" in out


def test_a_renamed_site_in_catalog_json_refuses_or_is_disclosed(tmp_path):
    run = _run(tmp_path / "run")  # closed: the seal carries the catalog's sha256
    text = (run / "catalog.json").read_text()
    (run / "catalog.json").write_text(text.replace('"s1"', '"sX"'))
    _refuses(run, "history_artifact_corrupt")
    live = tmp_path / "live"  # killed: the last commit row carries the catalog's sha256
    w = HistoryWriter(live, commit_steps=1, commit_seconds=None)
    ids = [w.register_site("s0", "t", "sig")]
    b = ObservationBatch.observed("activation", "forward", ids, np.ones((1, SPINE_WIDTH)))
    w.write_step(StepBlockRecord(0), [b])
    w._unlock()
    assert open_run(live).catalog_confirmed
    text = (live / "catalog.json").read_text()
    (live / "catalog.json").write_text(text.replace('"s0"', '"sX"'))
    assert not open_run(live).catalog_confirmed

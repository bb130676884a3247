"""The background writer (``HistoryWriter(background=True)``): same artifact, no I/O on the caller.

* the same steps give the same chunk bytes and the same reader output as the synchronous writer;
* ``write_step`` makes no file operation on the caller's thread: every commit's work is on the
  ``stepscope-writer`` thread;
* a disk that stalls never blocks ``write_step``: past ``max_queued_steps`` a step keeps its block
  and scalars and its cells become ``budget_dropped`` rows disclosed ``writer_behind``, counted;
* a disk fault met by the thread warns once on the caller's thread and recovers;
* interpreter exit without ``close()`` flushes (``atexit``).

No timing decides a test: the stalled disk is an ``Event`` the test holds.
"""

import contextlib
import errno
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope.errors import Refusal
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history import pending as pending_module
from stepscope.history.artifact import WRITER_THREAD
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence
from stepscope.stats import SPINE_WIDTH
from tests.filekit import spy_file_ops

N_SITES = 5
OBSERVED = code_of(Presence.OBSERVED)
ABSENT = code_of(Presence.SITE_ABSENT)
DROPPED = code_of(Presence.BUDGET_DROPPED)
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _spines(step: int, n: int = N_SITES) -> np.ndarray:
    """Counts that are valid spines, values a pure function of the step."""
    s = np.zeros((n, SPINE_WIDTH))
    s[:, 0] = s[:, 1] = 4
    s[:, 2:] = np.arange(n * (SPINE_WIDTH - 2)).reshape(n, -1) + step
    return s


def _batches(w: HistoryWriter, ids: list[int], step: int) -> list[ObservationBatch]:
    """An activation batch (histograms every other step) and a gradient batch with an absent
    row and per-row disclosures."""
    width = w.descriptor.width
    hist = {}
    if step % 2 == 0:
        hist = {
            "hist_rows": np.array([0, 2]),
            "histograms": np.arange(2 * width, dtype=np.int64).reshape(2, width) + step,
        }
    act = ObservationBatch.observed("activation", "forward", ids, _spines(step), **hist)
    presence = np.full(len(ids), OBSERVED, np.uint8)
    presence[1] = ABSENT
    spines = _spines(step + 1000)
    spines[1] = np.nan
    notes = tuple(("update_sampled:8",) if i % 2 else () for i in range(len(ids)))
    grad = ObservationBatch(
        "gradient",
        "pre_step",
        np.asarray(ids),
        presence,
        spines,
        scale_grad="unscaled",
        row_disclosures=notes,
    )
    return [act, grad]


def _write(path, n_steps: int, hold_thread: bool = False, **kw) -> HistoryWriter:
    """``n_steps`` steps of two streams, step scalars and a late scalar row; returns the writer
    (open). ``hold_thread``: the writer thread cannot take the queue until every step is
    written (it then takes them all at once, as on a loaded machine)."""
    w = HistoryWriter(path, commit_seconds=None, **kw)
    ids = [w.register_site(f"s{i}", "torch.nn.Linear", "f32[4]") for i in range(N_SITES)]
    with w._cond if hold_thread else contextlib.nullcontext():  # the queue's lock (re-entrant)
        for step in range(n_steps):
            block = StepBlockRecord(step, examples_seen=8 * (step + 1), wall_time=1000.0 + step)
            w.write_step(block, _batches(w, ids, step), scalars={"loss": 1.0 / (step + 1)})
            if step % 3 == 0:
                w.write_scalar("lr", step, 0.1 * step)
        assert not hold_thread or w.committed_step is None  # the thread has taken nothing yet
    return w


def _chunk_bytes(path) -> list[bytes]:
    """Every committed chunk's bytes in commit order (chunk names carry the segment id)."""
    h = ss.open_run(path)
    return [(path / "chunks" / f["name"]).read_bytes() for r in h.commits for f in r["files"]]


def _reader_output(path) -> dict:
    h = ss.open_run(path)
    out = {
        "steps": h.steps.tolist(),
        "blocks": h.step_blocks(),
        "loss": h.scalars("loss").values.tolist(),
        "lr": h.scalars("lr").values.tolist(),
        "disclosures": h.disclosures,
    }
    for table in ("observations", "histograms", "steps", "scalars"):
        rows = h.table(table)  # in commit order: sorted by key, the grouping does not show
        keys = [
            rows[k]
            for k in ("phase", "stream", "micro_batch", "site", "name")
            if k in rows.dtype.names
        ]
        rows = rows[np.lexsort([*keys, rows["step"]])]
        out[f"table:{table}"] = (
            str(rows.dtype),
            len(rows),
            rows.tobytes(),
        )  # NaN spines compare as bytes
    assert h.verify().ok
    return out


def test_one_commit_writes_byte_identical_chunks_in_both_modes(tmp_path):
    for mode in (False, True):
        w = _write(tmp_path / f"bg{mode}", 12, commit_steps=1000, background=mode)
        assert w.commit() is not None and w.committed_step == 11
        w.close()
    assert _chunk_bytes(tmp_path / "bgTrue") == _chunk_bytes(tmp_path / "bgFalse")
    assert _reader_output(tmp_path / "bgTrue") == _reader_output(tmp_path / "bgFalse")


def test_grouped_commits_read_back_identically_in_both_modes(tmp_path):
    reports = {}
    for mode in (False, True):
        reports[mode] = _write(tmp_path / f"bg{mode}", 25, commit_steps=2, background=mode).close()
        assert reports[mode].ok and reports[mode].committed_step == 24
    bg, sync = _reader_output(tmp_path / "bgTrue"), _reader_output(tmp_path / "bgFalse")
    assert bg == sync and bg["steps"] == list(range(25))


@pytest.mark.parametrize("hold_thread", [False, True], ids=["thread_free", "thread_late"])
def test_commits_land_at_the_same_steps_as_the_synchronous_writers(tmp_path, hold_thread):
    """The step rule groups the same steps into each commit however many steps the thread takes
    from the queue at once: same chunks, same index rows, same row order from the reader."""
    for mode in (False, True):
        kw = {"hold_thread": hold_thread and mode, "commit_steps": 5, "background": mode}
        assert _write(tmp_path / f"bg{mode}", 23, **kw).close().ok
    spans = {
        m: [(r["step_lo"], r["step_hi"]) for r in ss.open_run(tmp_path / f"bg{m}").commits]
        for m in (False, True)
    }
    assert spans[True] == spans[False]  # (a late scalar row of step 9 goes with 10..14)
    assert [hi for _, hi in spans[True]] == [4, 9, 14, 19, 22]
    assert _chunk_bytes(tmp_path / "bgTrue") == _chunk_bytes(tmp_path / "bgFalse")
    bg, sync = ss.open_run(tmp_path / "bgTrue"), ss.open_run(tmp_path / "bgFalse")
    for table in ("observations", "histograms", "steps", "scalars"):  # unsorted: commit order
        assert bg.table(table).tobytes() == sync.table(table).tobytes(), table




def test_write_step_makes_no_file_operation_on_the_callers_thread(tmp_path, monkeypatch):
    w = HistoryWriter(tmp_path / "run", commit_steps=2, commit_seconds=None, background=True)
    ids = [w.register_site(f"s{i}", "torch.nn.Linear", "f32[4]") for i in range(N_SITES)]
    calls: list[tuple[str, str, str]] = []
    spy_file_ops(monkeypatch, calls)
    for step in range(20):
        w.write_step(StepBlockRecord(step), _batches(w, ids, step), scalars={"loss": 1.0})
        w.write_scalar("lr", step, 0.5)
    assert w.commit() is not None  # explicit: waits for the thread, which does the writing
    monkeypatch.undo()
    assert w.close().ok
    assert calls, "no file operation was recorded"
    threads = {t for _, t, _ in calls}
    assert threads == {WRITER_THREAD}, calls
    assert {"fsync", "replace", "pwrite"} <= {op for op, _, _ in calls}  # chunks and index line
    h = ss.open_run(tmp_path / "run")
    assert h.steps.tolist() == list(range(20))


def test_a_stalled_disk_never_blocks_write_step_and_late_steps_are_disclosed(tmp_path, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real = pending_module.atomic_write_bytes

    def stalled(*a, **k):  # the disk hangs until the test lets it go
        entered.set()
        release.wait()
        return real(*a, **k)

    monkeypatch.setattr(pending_module, "atomic_write_bytes", stalled)
    path = tmp_path / "run"
    w = HistoryWriter(
        path, commit_steps=1, commit_seconds=None, background=True, max_queued_steps=3
    )
    ids = [w.register_site(f"s{i}", "torch.nn.Linear", "f32[4]") for i in range(N_SITES)]
    w.write_step(StepBlockRecord(0, examples_seen=8), _batches(w, ids, 0), scalars={"loss": 0.0})
    assert entered.wait(60), "the writer thread never began its commit"
    for step in range(1, 10):  # the thread is stuck in step 0's commit
        block = StepBlockRecord(step, examples_seen=8 * (step + 1))
        assert w.write_step(block, _batches(w, ids, step), scalars={"loss": float(step)}) is False
        assert not release.is_set()  # returned while the disk is still stalled
    assert w.committed_step is None and w.commits == 0  # nothing reported before it is durable
    assert w.pending_steps == 10 and w.behind_steps == 6  # steps 1..3 queued, 4..9 behind
    release.set()
    report = w.close()
    assert report.behind_steps == 6 and report.uncommitted_steps == 0 and not report.ok
    assert report.committed_step == 9 and report.dropped_steps == 0 and not report.faults

    h = ss.open_run(path)
    assert h.verify().ok
    assert h.steps.tolist() == list(range(10))  # every block is kept
    assert [b.examples_seen for b in h.step_blocks()] == [8 * (s + 1) for s in range(10)]
    assert h.scalars("loss").values.tolist() == [float(s) for s in range(10)]  # scalars kept
    rows = h.table("observations")
    late = rows["step"] >= 4
    assert (rows["presence"][late] == DROPPED).all()
    assert {h.disclosures[d] for d in rows["disclosure"][late]} == {("writer_behind",)}
    assert np.isnan(rows["spine"][late]).all()
    assert (rows["presence"][~late] != DROPPED).all()  # nothing else lost
    assert late.sum() == 6 * 2 * N_SITES  # each late step keeps its cells (two streams)
    act = h.series("s0", "activation", "sum")
    np.testing.assert_array_equal(act.values[:4], [_spines(s)[0, 10] for s in range(4)])
    assert (act.presence_names()[4:] == Presence.BUDGET_DROPPED.value).all()
    assert set(h.table("histograms")["step"].tolist()) == {0, 2}  # no late histogram


def test_a_bad_max_queued_steps_or_background_refuses(tmp_path):
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(Refusal) as err:
            HistoryWriter(tmp_path / "r", background=True, max_queued_steps=bad)
        assert err.value.code == "settings_invalid"
    with pytest.raises(Refusal) as err:
        HistoryWriter(tmp_path / "r", background="yes")
    assert err.value.code == "settings_invalid"


def test_bad_input_still_refuses_on_the_callers_thread(tmp_path):
    w = HistoryWriter(tmp_path / "run", background=True)
    ids = [w.register_site("s0", "t", "x")]
    with pytest.raises(Refusal) as err:
        w.write_step(
            StepBlockRecord(0),
            [ObservationBatch.observed("activation", "forward", [7], _spines(0, 1))],
        )
    assert err.value.code == "history_series_unknown"
    b = ObservationBatch.observed("activation", "forward", ids, _spines(0, 1))
    with pytest.raises(Refusal) as err:
        w.write_step(StepBlockRecord(0), [b, b])
    assert err.value.code == "stat_payload_invalid"
    w.write_step(StepBlockRecord(3), [b])
    with pytest.raises(Refusal) as err:
        w.write_step(StepBlockRecord(3), [b])
    assert err.value.code == "history_step_out_of_order"
    assert w.close().ok and ss.open_run(tmp_path / "run").steps.tolist() == [3]
    with pytest.raises(Refusal) as err:
        w.write_step(StepBlockRecord(4))
    assert err.value.code == "history_writer_closed"
    assert w.close().ok  # idempotent


def test_a_trusted_step_without_rows_takes_the_one_call_path_and_loses_nothing(tmp_path):
    """A collector's quiet step (trusted, no batch, known float scalars) is queued in one call
    (``_write_bare``), also past the queue bound (counted ``behind``, nothing to drop); what
    that path cannot take goes through the checked path: a new scalar name, a non-float value,
    a step out of order (refused on the caller's thread, nothing written)."""
    w = HistoryWriter(tmp_path / "run", commit_seconds=None, background=True, max_queued_steps=4)
    w.write_step(StepBlockRecord(0), [], scalars={"loss": 1.0}, trusted=True)  # new: checked
    assert w.commit() is not None
    with w._cond:  # the thread cannot take the queue: it fills past its bound of 4
        for step in range(1, 9):
            w.write_step(StepBlockRecord(step), [], scalars={"loss": float(step)}, trusted=True)
        assert w._queued_full == 4 and w.behind_steps == 4
        w.write_step(StepBlockRecord(9), [], scalars={"loss": 9, "new": 0.5}, trusted=True)
        with pytest.raises(Refusal) as err:
            w.write_step(StepBlockRecord(9), [], scalars={"loss": 1.0}, trusted=True)
        assert err.value.code == "history_step_out_of_order"
    report = w.close()
    assert report.behind_steps == 5 and report.uncommitted_steps == 0 and not report.faults
    h = ss.open_run(tmp_path / "run")
    assert h.steps.tolist() == list(range(10))  # behind: no cell to drop, every block kept
    assert h.scalars("loss").values.tolist() == [1.0] + [float(s) for s in range(1, 10)]
    assert h.scalars("new").steps.tolist() == [9]


def test_a_disk_fault_on_the_writer_thread_warns_once_on_the_callers_thread(tmp_path, monkeypatch):
    on = [False]
    real_replace = os.replace

    def replace(a, b):
        if on[0]:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "run"
    w = HistoryWriter(
        path, commit_steps=2, commit_seconds=None, background=True, max_pending_steps=6
    )
    ids = [w.register_site(f"s{i}", "t", "x") for i in range(N_SITES)]
    main = threading.current_thread()
    seen = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        real_warn = warnings.warn

        def warn(*a, **k):
            seen.append(threading.current_thread())
            return real_warn(*a, **k)

        monkeypatch.setattr(warnings, "warn", warn)
        for step in range(30):
            if step == 4:
                w.commit()  # (None: the step rule committed steps 0..3 already)
                assert w.committed_step == 3 and w.pending_steps == 0
                on[0] = True
            if step == 20:
                w.commit()  # the thread met the fault: reported here at the latest
                assert w.faults
                on[0] = False
            b = ObservationBatch.observed("activation", "forward", ids, _spines(step))
            w.write_step(StepBlockRecord(step), [b], scalars={"x": float(step)})
        report = w.close()
    faults = [c for c in caught if "history_disk_fault" in str(c.message)]
    assert len(faults) == 1 and seen == [main]
    assert report.faults and report.uncommitted_steps == 0 and report.dropped_steps > 0
    h = ss.open_run(path)
    assert h.verify().ok and h.steps.tolist() == list(range(30))
    assert h.scalars("x").values.tolist() == [float(s) for s in range(30)]
    rows = h.table("observations")
    sel = rows["presence"] == DROPPED
    assert sel.sum() == report.dropped_steps * N_SITES
    assert {h.disclosures[d] for d in rows["disclosure"][sel]} == {("disk_fault",)}
    assert 4 <= rows["step"][sel].min() and rows["step"][sel].max() < 20
    s = h.series("s0", "activation", "sum")
    np.testing.assert_array_equal(s.values[s.valid], [_spines(t)[0, 10] for t in h.steps[s.valid]])


def test_a_refusal_on_the_writer_thread_is_raised_on_the_callers_thread(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise Refusal("history_artifact_corrupt", "chunks/ was replaced (injected)")

    path = tmp_path / "run"
    w = HistoryWriter(path, commit_steps=1000, commit_seconds=None, background=True)
    ids = [w.register_site("s0", "t", "x")]
    w.write_step(
        StepBlockRecord(0), [ObservationBatch.observed("activation", "forward", ids, _spines(0, 1))]
    )
    monkeypatch.setattr(pending_module, "atomic_write_bytes", refuse)
    with pytest.raises(Refusal) as err:
        w.commit()
    assert err.value.code == "history_artifact_corrupt" and w.committed_step is None
    monkeypatch.undo()
    assert w.commit() is not None and w.committed_step == 0  # the rows stayed pending
    assert w.close().ok


_EXITING_CHILD = """
import sys
import numpy as np
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.stats import SPINE_WIDTH

def spines(step):
    s = np.zeros((2, SPINE_WIDTH)); s[:, :2] = 4; s[:, 2:] = step
    return s

KEPT = HistoryWriter(sys.argv[1], commit_steps=1000, commit_seconds=None, background=True)
dropped = HistoryWriter(sys.argv[2], commit_steps=1000, commit_seconds=None, background=True)
for w in (KEPT, dropped):
    ids = [w.register_site(f"s{i}", "t", "x") for i in range(2)]
    for step in range(40):
        b = ObservationBatch.observed("activation", "forward", ids, spines(step))
        w.write_step(StepBlockRecord(step), [b], scalars={"x": float(step)})
del dropped, w  # no reference left: the writer thread keeps it alive until exit
print("exiting without close", flush=True)
"""


def test_interpreter_exit_without_close_flushes_every_step(tmp_path):
    kept, dropped = tmp_path / "kept", tmp_path / "dropped"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_EXITING_CHILD), str(kept), str(dropped)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "exiting without close" in proc.stdout
    for path in (kept, dropped):
        h = ss.open_run(path)
        assert h.steps.tolist() == list(range(40))
        assert h.scalars("x").values.tolist() == [float(s) for s in range(40)]
        np.testing.assert_array_equal(h.series("s1", "activation", "sum").values, range(40))
        assert h.verify().ok and h.sealed  # closed by the exit hook: its log is sealed


def _train(settings, n_steps: int = 8, calls: list | None = None, evals: bool = False):
    """Train a small model ``n_steps`` steps; returns the closed collector and the names of the
    threads its creation started. ``calls`` gets ``"train"`` / ``"close"`` marks; ``evals``
    logs an evaluation after every third step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = set(threading.enumerate())
    c = ss.HistoryCollector(model, cadence=1, settings=settings)
    started = {t.name for t in set(threading.enumerate()) - before}
    if calls is not None:
        calls.append("train")  # the artifact is created: what follows is the training loop
    for _ in range(n_steps):
        with c.step(opt, examples=2):
            model(torch.randn(2, 4)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            c.log("loss", 1.0)
        if evals and c._next_step % 3 == 0:
            c.log_eval("validation", {"ce": float(c._next_step)})
    if calls is not None:
        calls.append("close")
    c.close()
    return c, started


def test_the_collector_writes_through_the_background_writer_by_default(tmp_path, monkeypatch):
    assert ss.WatchSettings().background_writer is True
    with pytest.raises(TypeError, match="background_writer"):
        ss.WatchSettings(background_writer="yes")
    calls: list = []
    real = os.fsync

    def fsync(fd):
        calls.append(threading.current_thread().name)
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "run"
    settings = ss.WatchSettings(output_dir=str(path), commit_steps=2, commit_seconds=None)
    c, started = _train(settings, calls=calls)
    monkeypatch.undo()
    assert started == {WRITER_THREAD} and c.writer.background
    assert c.close_report.ok and c.close_report.behind_steps == 0
    during = calls[calls.index("train") + 1 : calls.index("close")]
    assert set(during) <= {WRITER_THREAD}  # no fsync on the training thread
    after = calls[calls.index("close") + 1 :]
    assert WRITER_THREAD in during + after  # the commits' fsyncs: on the writer thread
    h = ss.open_run(path)
    assert h.steps.tolist() == list(range(8)) and h.scalars("loss").values.tolist() == [1.0] * 8


def test_a_training_loop_with_evaluations_does_no_file_operation_on_its_thread(
    tmp_path, monkeypatch
):
    """Every file operation between the collector's creation and its close, ``evals.log``
    appends and their fsyncs included, runs on the writer thread; every evaluation is in
    ``evals.log``, in order, with its position, and visible to a reader as soon as it is
    logged (``run_view()`` waits for the thread)."""
    calls: list = []
    spy_file_ops(monkeypatch, calls)
    path = tmp_path / "run"
    settings = ss.WatchSettings(output_dir=str(path), commit_steps=4, commit_seconds=None)
    c, _ = _train(settings, n_steps=12, calls=calls, evals=True)
    monkeypatch.undo()
    assert c.close_report.ok
    during = calls[calls.index("train") + 1 : calls.index("close")]
    appends = [c for c in during if c[0] == "open" and c[2].endswith("evals.log")]
    assert appends and {t for _, t, _ in appends} == {WRITER_THREAD}  # the evaluations'...
    assert {t for _, t, _ in during} == {WRITER_THREAD}, during  # ...and every other one
    evals = ss.open_run(path).evals("validation")
    assert [(e.optimizer_step, e.metrics["ce"]) for e in evals] == [(s, s) for s in (3, 6, 9, 12)]


def test_an_evaluation_is_visible_to_the_run_view_as_soon_as_it_is_logged(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = ss.HistoryCollector(model, settings=ss.WatchSettings(output_dir=str(tmp_path / "run")))
    assert c.writer.background
    for step in range(3):
        with c.step(opt, examples=2):
            model(torch.randn(2, 4)).square().mean().backward()
            opt.step()
        c.log_eval("validation", {"ce": float(step)})
        seen = [e.metrics["ce"] for e in c.run_view().evals("validation")]
        assert seen == [float(s) for s in range(step + 1)]
    c.close()


def test_the_collector_commits_on_the_training_thread_when_asked(tmp_path):
    off = ss.WatchSettings(output_dir=str(tmp_path / "off"), background_writer=False)
    c, started = _train(off)
    assert WRITER_THREAD not in started and not c.writer.background
    recorder = ss.WatchSettings(
        output_dir=str(tmp_path / "fr"), flight_recorder=ss.FlightRecorder(window=8)
    )
    c, started = _train(recorder)  # a flight recorder saves its window through the thread
    assert WRITER_THREAD in started and c.writer.background
    assert (tmp_path / "fr" / "forensics" / "ring.npy").is_file()
    for name in ("off", "fr"):
        assert ss.open_run(tmp_path / name).steps.tolist() == list(range(8))


def _growing(path, background: bool) -> None:
    """Every step registers a new site and a new disclosure set while the thread commits."""
    w = HistoryWriter(path, commit_steps=1, commit_seconds=None, background=background)
    ids = []
    for step in range(40):
        ids.append(w.register_site(f"grown{step}", "torch.nn.Linear", f"f32[{step + 1}]"))
        b = ObservationBatch.observed(
            "activation", "forward", ids, _spines(step, len(ids)), disclosures=(f"note{step}",)
        )
        scalars = {"loss": float(step), f"scalar{step % 7}": float(step)}
        w.write_step(StepBlockRecord(step), [b], scalars=scalars)
        w.write_scalar("lr", step, 0.5)
    assert w.close().ok


def test_sites_registered_while_the_thread_writes_the_catalog_are_all_cataloged(tmp_path):
    for mode in (False, True):
        _growing(tmp_path / f"bg{mode}", mode)
    bg, sync = ss.open_run(tmp_path / "bgTrue"), ss.open_run(tmp_path / "bgFalse")
    assert bg.verify().ok  # every index row's catalog names its sites and disclosure sets
    assert [s.name for s in bg.sites] == [s.name for s in sync.sites]
    assert bg.disclosures == sync.disclosures
    assert _reader_output(tmp_path / "bgTrue") == _reader_output(tmp_path / "bgFalse")
    last = bg.series("grown39", "activation", "sum")
    assert last.steps.tolist() == [39]

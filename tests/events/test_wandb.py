"""W&B tracker: a real offline run read back from its .wandb file, and a failing log() isolated.

The offline run file is read with an independent reader of W&B's record log (7-byte header
``:W&B`` + magic + version, then 32 KiB blocks of records framed by crc32/length/type, each a
``wandb_internal_pb2.Record``), not through the tracker.
"""

from __future__ import annotations

import filecmp
import json
import struct
import sys
import time
import types
import warnings

import numpy as np
import pytest

from stepscope import open_run
from stepscope.events import (
    EventKind,
    WandbLogWarning,
    WandbTracker,
    export_run,
    np_histogram,
    tensorboard_raw,
)
from stepscope.stats import HistogramDescriptor

BLOCK = 32768


def read_wandb_records(path) -> list:
    """Every Record of an offline ``run-*.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, payloads, buf = 7, [], b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):
            break  # a record the writer is still appending: read up to the last whole one
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            payloads.append(buf + chunk)
    out = []
    for p in payloads:
        r = pb.Record()
        r.ParseFromString(p)
        out.append(r)
    return out


def _wait_for_exit(path, timeout: float = 30.0) -> list:
    """W&B's core process may still be writing after finish() returns: wait for its exit record."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            records = read_wandb_records(path)
        except DecodeError:  # caught the writer between a record's fragments: read again
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has no exit record after {timeout} s")
        time.sleep(0.2)


def _history(records) -> list[dict]:
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                    for i in r.history.item
                }
            )
    return rows


def test_offline_run_holds_one_row_per_step_on_the_optimizer_step_axis(ev, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = WandbTracker(project="stepscope-test", dir=tmp_path / "wb", mode="offline", name="t")
    run = ev.train(tmp_path / "run", n_steps=3, subscribers=[tracker])
    (path,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wait_for_exit(path)
    metrics = [r.metric for r in records if r.WhichOneof("record_type") == "metric"]
    assert any(m.name == "optimizer_step" for m in metrics)
    assert any(m.glob_name == "*" and m.step_metric == "optimizer_step" for m in metrics)
    rows = _history(records)
    assert [r["optimizer_step"] for r in rows] == [0, 1, 2]  # one batched row per step
    assert [r["examples_seen"] for r in rows] == [16, 32, 48]
    for row, events in zip(rows, run.events):
        scalars = {e.name: e.value for e in events if e.kind is EventKind.SCALAR}
        # the readable tags (docs/events.md), full float64, from the events' own numbers
        assert row["loss"] == scalars["loss"]
        for site in ev.LINEARS:
            assert row[f"grad/{site}/norm"] == scalars[f"gradient.pre_step/{site}/l2"]
            assert row[f"param/{site}/absmax"] == scalars[f"parameter.pre_step/{site}/absmax"]
            ratio = (
                scalars[f"update.post_step/{site}/l2"] / scalars[f"parameter.pre_step/{site}/l2"]
            )
            assert row[f"update/{site}/ratio"] == pytest.approx(ratio, rel=1e-15)
        mean, std = (
            scalars["activation.forward/relu1/mean"],
            scalars["activation.forward/relu1/std"],
        )
        assert row["act/relu1/rms"] == pytest.approx(np.hypot(mean, std), rel=1e-15)
        assert row["act/relu1/zero_fraction"] == scalars["activation.forward/relu1/zero_fraction"]
        assert not any(k.endswith(("/mean", "/std", "/min", "/max")) for k in row)  # full only
        hist = next(e for e in events if e.kind is EventKind.HISTOGRAM_COUNTS)
        counts, edges = np_histogram(hist.histogram)
        tag = f"act/{hist.site}"
        key = tag + "/exponent_view"
        stored = {k.rsplit("/", 1)[-1]: v for k, v in row.items() if k.startswith(key + "/")}
        assert stored["_type"] == "histogram"
        assert stored["values"] == counts.tolist() and stored["bins"] == edges.tolist()
        # beside it, the value axis: the exact finite bins TensorBoard gets, min to max
        pre = tag + "/"
        value = {
            k[len(pre) :]: v
            for k, v in row.items()
            if k.startswith(pre) and "/" not in k[len(pre) :]
        }
        raw, st = tensorboard_raw(hist.histogram), hist.histogram.stats()
        assert value["_type"] == "histogram" and sum(value["values"]) == st.finite
        assert value["values"] == raw["bucket_counts"]
        assert value["bins"][0] == st.min and value["bins"][-1] == raw["bucket_limits"][-1]
        assert value["bins"] == sorted(value["bins"])
    assert tracker.rows_sent == 3 and tracker.failed_rows == 0


def test_export_puts_the_run_record_in_the_offline_runs_config(ev, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    ev.train(tmp_path / "run", n_steps=2)
    export_run(tmp_path / "run", wandb=tmp_path / "wb")
    (path,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wait_for_exit(path)
    config = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind in ("config", "run"):  # the run record carries the init config
            items = r.config.update if kind == "config" else r.run.config.update
            config.update({i.key: json.loads(i.value_json) for i in items})
    record = config["stepscope_run_record"]
    assert record["run_id"] == "events-test" and config["stepscope_x_axis"] == "optimizer_step"
    assert record["histogram_descriptor"] == HistogramDescriptor().to_dict()
    assert record == json.loads(json.dumps(open_run(tmp_path / "run").run.to_dict()))


class FakeRun:
    def __init__(self, fail_log: bool):
        self.calls: list[tuple] = []
        self.fail_log = fail_log

    def define_metric(self, *a, **k):
        self.calls.append(("define_metric", a, k))

    def log(self, row):
        self.calls.append(("log", dict(row)))
        if self.fail_log:
            raise ConnectionError("network unreachable")

    def finish(self):
        self.calls.append(("finish",))


def fake_wandb(fail_log: bool) -> types.ModuleType:
    mod = types.ModuleType("wandb")
    mod.runs = []  # type: ignore[attr-defined]

    def init(**kwargs):
        run = FakeRun(fail_log)
        run.calls.append(("init", kwargs))
        mod.runs.append(run)  # type: ignore[attr-defined]
        return run

    def watch(*a, **k):  # pragma: no cover - must never be called
        raise AssertionError("wandb.watch must never be called")

    mod.init = init  # type: ignore[attr-defined]
    mod.watch = watch  # type: ignore[attr-defined]
    mod.Histogram = lambda np_histogram: ("hist", np_histogram)  # type: ignore[attr-defined]
    return mod


def test_failing_log_neither_blocks_training_nor_changes_the_artifact(ev, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(fail_log=True))
    tracker = WandbTracker(project="p", mode="offline")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        noisy = ev.train(tmp_path / "with", n_steps=5, subscribers=[tracker])
    ev.train(tmp_path / "without", n_steps=5)
    assert noisy.steps == [0, 1, 2, 3, 4]  # training carried on
    assert tracker.failed_rows == 5 and tracker.rows_sent == 0
    assert "network unreachable" in tracker.last_error
    assert len([w for w in caught if issubclass(w.category, WandbLogWarning)]) == 1
    assert noisy.bus.status(tracker).failures == 0  # caught inside the tracker
    chunks = sorted(p.name for p in (tmp_path / "with" / "chunks").iterdir())
    _, mismatch, errors = filecmp.cmpfiles(
        tmp_path / "with" / "chunks", tmp_path / "without" / "chunks", chunks, shallow=False
    )
    assert chunks and mismatch == [] and errors == []


def test_rows_are_batched_per_step_and_watch_is_never_called(ev, tmp_path, monkeypatch):
    mod = fake_wandb(fail_log=False)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    tracker = WandbTracker(project="p", axis="examples_seen")
    ev.train(tmp_path / "run", n_steps=4, subscribers=[tracker])
    (run,) = mod.runs
    names = [c[0] for c in run.calls]
    assert names.count("log") == 4 and names[-1] == "finish"
    assert ("define_metric", ("*",), {"step_metric": "examples_seen"}) in run.calls
    init = next(c[1] for c in run.calls if c[0] == "init")
    assert init["config"]["stepscope_x_axis"] == "examples_seen"  # the run says its axis
    logs = [c[1] for c in run.calls if c[0] == "log"]
    assert [r["examples_seen"] for r in logs] == [16, 32, 48, 64]
    assert all(r["optimizer_step"] == i for i, r in enumerate(logs))
    counts, edges = logs[0]["act/fc1/exponent_view"][1]
    assert len(counts) + 1 == len(edges) <= 513 and sum(counts) == 16 * 16


def test_np_histogram_coarsens_exactly_to_at_most_512_bins():
    from stepscope.events import HistogramPayload
    from stepscope.stats import SPINE_WIDTH, HistogramDescriptor

    d = HistogramDescriptor()
    counts = np.arange(d.width, dtype=np.int64) % 7  # every bin occupied, specials too
    counts[-3:] = 0  # no NaN/inf
    payload = HistogramPayload(counts, np.zeros(SPINE_WIDTH), d)
    c, e = np_histogram(payload)
    assert len(c) <= 512 and len(e) == len(c) + 1
    assert c.sum() == counts[:-3].sum()
    assert np.all(np.diff(e) > 0)


def test_missing_wandb_refuses_extra_missing(monkeypatch):
    from stepscope.errors import Refusal

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(Refusal) as err:
        WandbTracker(project="p")
    assert err.value.code == "extra_missing"
    assert any("stepscope[wandb]" in r for r in err.value.remedies)

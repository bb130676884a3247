"""The real TensorBoard server, default (fast) loader, read through its HTTP API.

``EventAccumulator`` reads tensor summaries that the default loader's Scalars page does not show,
so these tests start ``tensorboard --logdir DIR`` on localhost exactly as a user would and ask it
what it shows: run names, scalar tags and values, histogram tags and buckets, text tags.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from stepscope.cli import main
from stepscope.events import EventKind

START_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **query: str):
    url = base + path + ("?" + urllib.parse.urlencode(query) if query else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@contextmanager
def tensorboard_server(logdir: Path):
    """``tensorboard --logdir logdir`` on a free localhost port (default loader); always killed."""
    exe = shutil.which("tensorboard", path=str(Path(sys.executable).parent)) or shutil.which(
        "tensorboard"
    )
    if exe is None:
        pytest.skip("the tensorboard executable is not installed")
    port = _free_port()
    log = open(logdir.parent / "tensorboard.log", "wb")
    proc = subprocess.Popen(
        [exe, "--logdir", str(logdir), "--port", str(port), "--host", "127.0.0.1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    "tensorboard exited: " + (logdir.parent / "tensorboard.log").read_text()
                )
            try:
                _get(base, "/data/runs")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("tensorboard did not answer in time") from None
                time.sleep(0.5)
        yield base
    finally:
        proc.kill()
        proc.wait(timeout=30)
        log.close()


def _wait_for(fetch, ready, timeout: float = START_TIMEOUT_S):
    """Poll ``fetch()`` until ``ready(value)``: the loader reads event files in the background."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if ready(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def test_default_loader_shows_scalars_histograms_and_run_names(ev, tmp_path, capsys):
    run = ev.train(tmp_path / "run", n_steps=3, inject_nan=(2, "fc2"))
    assert main(["export", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")]) == 0
    capsys.readouterr()
    events = [e for step in run.events for e in step]
    scalars = [e for e in events if e.kind is EventKind.SCALAR]
    hists = [e for e in events if e.kind is EventKind.HISTOGRAM_COUNTS]
    with tensorboard_server(tmp_path / "tb") as base:
        tags = _wait_for(
            lambda: _get(base, "/data/plugin/scalars/tags"),
            lambda t: "loss" in t.get("events-test", {}),
        )
        assert "events-test" in _get(base, "/data/runs")  # the run is named, not "."
        run_tags = tags["events-test"]
        assert {e.name for e in scalars} <= set(run_tags)
        for name in ("loss", "gradient.pre_step/fc2/l2", "activation.forward/fc3/nonfinite_count"):
            want = {e.optimizer_step: e.value for e in scalars if e.name == name}
            got = _get(base, "/data/plugin/scalars/scalars", run="events-test", tag=name)
            got_by_step = {int(step): float(v) for _, step, v in got}  # JSON says "NaN"
            assert sorted(got_by_step) == sorted(want)
            np.testing.assert_array_equal(  # float32 of the logged value, NaN where NaN
                [got_by_step[s] for s in sorted(want)],
                [np.float32(want[s]) for s in sorted(want)],
            )
        # the NaN injected into fc2 at step 2: its output counts are scalars the UI shows
        nan_tag = "activation.forward/fc2/nan_count"
        got = _get(base, "/data/plugin/scalars/scalars", run="events-test", tag=nan_tag)
        spine_nonfinite = next(  # the spine kernel's count, independent of the histogram's
            e.value
            for e in scalars
            if e.name == "activation.forward/fc2/nonfinite_count" and e.optimizer_step == 2
        )
        nan_by_step = {int(s): v for _, s, v in got}
        assert spine_nonfinite > 0 and nan_by_step == {0: 0.0, 1: 0.0, 2: spine_nonfinite}

        htags = _get(base, "/data/plugin/histograms/tags")["events-test"]
        assert {e.name for e in hists} <= set(htags)
        assert "activation.forward/fc2/nonfinite" in htags
        assert any(t.endswith("/exponent_view/positive") for t in htags)
        e = hists[0]
        got = _get(base, "/data/plugin/histograms/histograms", run="events-test", tag=e.name)
        by_step = {int(step): buckets for _, step, buckets in got}
        counts = sum(c for _, _, c in by_step[e.optimizer_step])
        assert counts == pytest.approx(e.histogram.stats().finite)

        tag = "stepscope/run_record/text_summary"
        assert tag in _get(base, "/data/plugin/text/tags")["events-test"]
        (entry,) = _get(base, "/data/plugin/text/text", run="events-test", tag=tag)
        assert "events-test" in entry["text"] and "histogram_descriptor" in entry["text"]

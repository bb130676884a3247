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
    scalars = {(e.name, e.optimizer_step): e.value for e in events if e.kind is EventKind.SCALAR}
    hists = [e for e in events if e.kind is EventKind.HISTOGRAM_COUNTS]
    with tensorboard_server(tmp_path / "tb") as base:
        tags = _wait_for(
            lambda: _get(base, "/data/plugin/scalars/tags"),
            lambda t: "loss" in t.get("run", {}),
        )
        _wait_for(  # the loader reads in the background: wait for the last step's last scalar
            lambda: _get(base, "/data/plugin/scalars/scalars", run="run", tag="loss"),
            lambda rows: len(rows) == 3,
        )
        tags = _get(base, "/data/plugin/scalars/tags")
        assert "run" in _get(base, "/data/runs")  # named after the run's folder, not "."
        run_tags = set(tags["run"])
        # the readable tags, each equal (float32) to the event it shows, at its step
        shown = {
            "loss": "loss",
            "grad/fc2/norm": "gradient.pre_step/fc2/l2",
            "act/fc3/zero_fraction": "activation.forward/fc3/zero_fraction",
            "param/fc1/absmax": "parameter.pre_step/fc1/absmax",
        }
        assert set(shown) <= run_tags
        for tag, name in shown.items():
            want = {s: v for (n, s), v in scalars.items() if n == name}
            got = _get(base, "/data/plugin/scalars/scalars", run="run", tag=tag)
            got_by_step = {int(step): float(v) for _, step, v in got}  # JSON says "NaN"
            assert sorted(got_by_step) == sorted(want)
            np.testing.assert_array_equal(  # float32 of the logged value, NaN where NaN
                [got_by_step[s] for s in sorted(want)],
                [np.float32(want[s]) for s in sorted(want)],
            )
        # the NaN injected into fc2 at step 2: its output's non-finite count is shown on the
        # step that has it (never a flat line of zeros), and the step's total beside it
        got = _get(base, "/data/plugin/scalars/scalars", run="run", tag="act/fc2/nonfinite")
        spine_nonfinite = scalars[("activation.forward/fc2/nonfinite_count", 2)]
        assert spine_nonfinite > 0 and {int(s): v for _, s, v in got} == {2: spine_nonfinite}
        got = _get(base, "/data/plugin/scalars/scalars", run="run", tag="health/nonfinite")
        total = {
            s: sum(v for (n, t), v in scalars.items() if t == s and n.endswith("/nonfinite_count"))
            for s in range(3)
        }
        assert {int(s): v for _, s, v in got} == total and total[0] == 0 < total[2]

        htags = _get(base, "/data/plugin/histograms/tags")["run"]
        assert "act/fc2/nonfinite_bands" in htags
        assert any(t.endswith("/exponent_view/positive") for t in htags)
        e = hists[0]
        got = _get(base, "/data/plugin/histograms/histograms", run="run", tag=f"act/{e.site}")
        by_step = {int(step): buckets for _, step, buckets in got}
        counts = sum(c for _, _, c in by_step[e.optimizer_step])
        assert counts == pytest.approx(e.histogram.stats().finite)

        tag = "run/record/text_summary"
        assert _get(base, "/data/plugin/text/tags")["run"] == [tag]  # no axis note, no hparams
        (entry,) = _get(base, "/data/plugin/text/text", run="run", tag=tag)
        assert "events-test" in entry["text"] and "histogram_descriptor" in entry["text"]
        hparams = _get(base, "/data/plugins_listing").get("hparams", {})
        assert not hparams.get("enabled", False)

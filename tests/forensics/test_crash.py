"""After ``kill -9``, what the flight recorder's window held at the last commit is on disk.

A child process trains with the recorder (a commit every 10 steps, none by time), writes the
test's own float64 every-step reading of one layer to a side file, and after step 55 waits to be
killed (with the background writer, once its thread saved the window of the commit at step 49;
on the training thread that is at once). ``kill -9``: the artifact opens to its last commit (step 49), and ``forensics/ring.npy``
holds exactly the window's rows at that commit (steps 18..49 of a 32-step window), equal to the
independent reading; the uncommitted steps 50..55 are in neither.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import stepscope as ss
from stepscope.forensics.archive import ForensicsFiles

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(ss.__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import stepscope as ss
    import tests.forensics.spikekit as kit
    from tests.forensics.spikekit import Independent, train
    out, side = sys.argv[1], open(sys.argv[2], "w")
    class Flushing(Independent):  # every value the test's hooks read, on disk at once
        def put(self, site, name, v):
            super().put(site, name, v)
            if site == "h.0.mlp.0.weight":
                side.write(json.dumps([self.step, name, v]) + "\\n"); side.flush()
    kit.Independent = Flushing
    from stepscope.forensics.archive import ForensicsFiles
    rec = ss.FlightRecorder(window=32, dense_steps=4)
    settings = ss.WatchSettings(output_dir=out, flight_recorder=rec, commit_steps=10,
                                commit_seconds=None, background_writer=sys.argv[3] == "thread")
    def hang(step):
        files = ForensicsFiles(out)  # the writer thread saves the window at its commits:
        deadline = time.monotonic() + 120  # wait until it saved the one of step 49
        while time.monotonic() < deadline:
            ring = files.ring(len(files.channels()[0])) if (files.dir / "ring.npy").exists() else None
            if ring is not None and len(ring.steps) and int(ring.steps[-1]) == 49:
                break
            time.sleep(0.01)
        print("ready", flush=True)
        time.sleep(600)
    kit.AFTER_STEP = lambda step: hang(step) if step == 55 else None
    train(100, settings)
    """
)


@pytest.mark.parametrize("writer", ["thread", "training_thread"])
def test_kill_9_leaves_the_window_of_the_last_commit_on_disk(tmp_path: Path, writer: str) -> None:
    out, side = tmp_path / "run", tmp_path / "side.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(out), str(side), writer],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        line = p.stdout.readline() if p.stdout else ""
        assert line.strip() == "ready", (line, p.stderr.read() if p.stderr else "")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        p.kill()
    assert p.returncode == -signal.SIGKILL
    run = ss.open_run(out)
    assert int(run.steps.max()) == 49  # committed at steps 9, 19, ..., 49
    files = ForensicsFiles(out)
    channels, _ = files.channels()
    ring = files.ring(len(channels))
    assert ring is not None
    assert ring.steps.tolist() == list(range(18, 50))
    independent: dict[tuple[int, str], float] = {}
    for raw in side.read_text().splitlines():
        step, name, v = json.loads(raw)
        independent[(step, name)] = v
    assert max(s for s, _ in independent) == 55  # the child had read steps 50..55 too
    compared = 0
    for j, c in enumerate(channels):
        if c.site != "h.0.mlp.0.weight":
            continue
        want = np.array([independent[(int(s), c.field)] for s in ring.steps])
        assert ring.present[:, j].all()
        np.testing.assert_allclose(ring.values[:, j], want, rtol=2e-5, equal_nan=False)
        compared += 1
    assert compared == 3  # grad_rms, update_rms, update_ratio (the default streams)

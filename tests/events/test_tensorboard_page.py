"""What a person sees in TensorBoard: the tag counts of the quickstart and of a demo run, and the
page itself, served by the real server and loaded in headless Chromium at 1280 and 390 px.

The quickstart (README: ``Linear(784, 256), ReLU, Linear(256, 10)``, ``sites="*"``, 20 steps) is
streamed live with ``WatchSettings(tensorboard=DIR)``; one ``stepscope demo --quick`` run is sent
with ``stepscope export``. Tags are read back with TensorBoard's own ``EventAccumulator``; the
counts are printed (docs/events.md states them) and asserted small, with the earlier flood still
there behind ``--detail full``.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

import stepscope as ss
from stepscope.cli import main

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator as ea

GROUPS = {"act", "grad", "param", "update"}  # the per-site groups, then the run-level ones
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
#: a folder to keep the screenshots in (default: the test's temporary folder)
SHOTS = os.environ.get("STEPSCOPE_TB_SCREENSHOTS")


def _quickstart(out, tb) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    settings = ss.WatchSettings(output_dir=out, tensorboard=tb)
    with ss.HistoryCollector(model, sites="*", settings=settings) as c:
        for x, y in [(torch.rand(64, 784), torch.randint(0, 10, (64,)))] * 20:
            with c.step(opt, examples=len(y), epoch=0) as st:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                st.log("loss", loss)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb_page")
    _quickstart(root / "runs" / "quickstart", root / "tb")
    demo = ["demo", "--quick", "--epochs", "1", "--variants", "plain", "--no-report"]
    demo += ["--out", str(root / "demo")]  # one epoch has the tags of two, in half the time
    assert main(demo) == 0
    for detail, tb in (("default", root / "tb"), ("full", root / "tb_full")):
        for run in (root / "runs" / "quickstart", root / "demo" / "plain-seed0"):
            args = ["export", str(run), "--tensorboard", str(tb), "--no-progress", "--detail"]
            if not (detail == "default" and run.name == "quickstart"):  # streamed live already
                assert main([*args, detail]) == 0
    return root


def _tags(run_dir) -> dict[str, list[str]]:
    acc = ea.EventAccumulator(str(run_dir), size_guidance={ea.SCALARS: 0, ea.IMAGES: 0})
    acc.Reload()
    return acc.Tags()


def _quickstart_tags() -> set[str]:
    """The default tags the docs promise for the quickstart model (docs/events.md, "Tags")."""
    acts, params = ("0", "1", "2"), ("0.weight", "0.bias", "2.weight", "2.bias")
    return (
        {f"act/{s}/{q}" for s in acts for q in ("rms", "absmax", "zero_fraction")}
        | {f"grad/{p}/{q}" for p in params for q in ("norm", "absmax", "zero_fraction")}
        | {f"param/{p}/{q}" for p in params for q in ("norm", "absmax")}
        | {f"update/{p}/ratio" for p in params}
        | {"loss", "health/nonfinite"}
        | {f"clock/{c}_seconds" for c in ("elapsed", "telemetry", "training")}
    )


@pytest.mark.slow
def test_the_quickstart_and_a_demo_run_have_a_few_readable_tags(logdir, capsys):
    quick, demo = _tags(logdir / "tb" / "quickstart"), _tags(logdir / "tb" / "plain-seed0")
    quick_full = _tags(logdir / "tb_full" / "quickstart")["scalars"]
    demo_full = _tags(logdir / "tb_full" / "plain-seed0")["scalars"]
    with capsys.disabled():
        print(
            f"\nTensorBoard scalar tags: quickstart {len(quick['scalars'])} "
            f"(--detail full {len(quick_full)}), demo --quick plain-seed0 "
            f"{len(demo['scalars'])} (--detail full {len(demo_full)})"
        )
    assert set(quick["scalars"]) == _quickstart_tags()  # 38: exactly what the docs list
    assert len(demo["scalars"]) <= 200
    assert len(quick_full) >= 150 and len(demo_full) >= 1000  # the flood is behind the option
    per_site = [t for t in demo["scalars"] if t.split("/")[0] in GROUPS | {"act_grad"}]
    assert all(len(t.split("/")) == 3 for t in per_site)  # <stream>/<site>/<quantity>
    assert not any(re.search(r"/confusion/\d+/\d+$", t) for t in demo["scalars"])
    assert not any(t.endswith(("_count", "/nan", "/posinf", "/neginf")) for t in demo["scalars"])
    # the confusion matrices are images, the run record is the only text
    assert set(demo["images"]) == {
        "eval/validation/confusion",
        "eval/test/confusion",
        "probe/model/confusion",
    }
    assert demo["tensors"] == ["run/record/text_summary"]


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def _chromium(*args: str) -> subprocess.CompletedProcess:
    # a profile of its own: a Chromium already running on the default profile (another test,
    # another user) would otherwise take the command line over and this one exit 0, doing nothing
    with tempfile.TemporaryDirectory() as profile:
        cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        cmd += [f"--user-data-dir={profile}", "--hide-scrollbars", "--virtual-time-budget=20000"]
        return subprocess.run([*cmd, *args], capture_output=True, timeout=180)


@pytest.mark.slow
@pytest.mark.skipif(
    BROWSER is None,
    reason="no Chromium found on PATH; install it (Debian: apt-get install -y chromium)",
)
def test_the_tensorboard_page_shows_the_tag_groups_in_chromium_at_1280_and_390_px(logdir, tmp_path):
    from tests.events.test_tensorboard_server import _get, _wait_for, tensorboard_server

    with tensorboard_server(logdir / "tb") as base:
        _wait_for(  # both runs loaded, to their last step
            lambda: _get(base, "/data/plugin/scalars/scalars", run="plain-seed0", tag="train/loss"),
            lambda rows: len(rows) == 55,
        )
        # the Time Series dashboard (TensorBoard's first page) renders its groups in the DOM;
        # the Scalars dashboard draws the same groups inside shadow roots --dump-dom cannot see
        done = _chromium("--window-size=1280,900", "--dump-dom", base + "/#timeseries")
        assert done.returncode == 0, done.stderr[-2000:]
        dom = done.stdout.decode("utf-8", "replace")
        groups = set(re.findall(r'class="group-title" title="([^"]+)"', dom)) - {"Pinned"}
        assert groups == GROUPS | {"act_grad", "health", "clock", "eval", "probe", "train", "loss"}
        shots = tmp_path if SHOTS is None else Path(SHOTS)
        for width, height in ((1280, 900), (390, 844)):
            for page in ("scalars",):
                shot = shots / f"tensorboard-{page}-{width}.png"
                done = _chromium(
                    f"--window-size={width},{height}", f"--screenshot={shot}", f"{base}/#{page}"
                )
                assert done.returncode == 0, done.stderr[-2000:]
                assert _png_size(shot) == (width, height)

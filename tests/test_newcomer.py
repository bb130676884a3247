"""A newcomer's first hour, scripted: everything the help and the docs tell them to type, twice.

In a fresh directory, every example line of every ``--help`` epilog (``stepscope --help`` and each
sub-command's) runs as printed, through a shell (pipes and all) with ``stepscope`` and ``python``
on the ``PATH``; then the whole list runs again in the same directory, the way a person re-runs
what worked. No line may be refused (``stepscope: refused``), print a traceback or exit non-zero.
Then the README's python quickstart and every self-contained python block of ``docs/*.md`` (one
whose names are all defined in it: ruff's undefined-name check, F821, finds none) run twice in one
fresh directory.

What is not run as printed, and why:

* ``stepscope demo`` lines run with ``--quick --no-report --variants plain`` added: the full
  study trains for minutes by design (tests/demo run it; its report is rendered by the
  ``stepscope report`` example instead, over one run to keep the test short);
* lines that are not ``stepscope`` commands: :data:`NOT_STEPSCOPE` (a server, an upload);
* a second run of a command whose output directory must be new refuses by design:
  :data:`KNOWN_RERUN_REFUSALS` (each still has to refuse with that code, or the entry goes).

The inputs the examples name are made first, cheaply: the demo's runs (by the demo example
itself), two rank runs under ``runs/ddp``, a tiny model file, checkpoint and probe for the
curvature examples, and a profiler trace for the profile examples.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.cli import build_parser

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: Example lines that are not stepscope commands, by how they start, and why they are not run.
NOT_STEPSCOPE: dict[str, str] = {
    "tensorboard --logdir": "starts a server that runs until stopped (tests/events run one)",
    "wandb sync": "uploads to wandb.ai (needs an account and the network)",
}

#: ``command prefix -> refusal code`` of examples whose second run refuses by design, and why.
KNOWN_RERUN_REFUSALS: dict[str, tuple[str, str]] = {
    "stepscope curvature --model": (
        "panel_output_exists",
        "a panel never overwrites an earlier one (tests/curvature: refuses a rerun)",
    ),
    "stepscope merge": ("history_run_exists", "a merge writes a new artifact (--out must be new)"),
}

#: Docs blocks that name no undefined variable yet need inputs only their prose describes.
NOT_SELF_CONTAINED: dict[str, str] = {
    "report_0": "renders runs/a/seed0 and runs/a/seed1, runs the reader is assumed to have",
}

DEMO_QUICK = " --quick --no-report --variants plain"

MODEL = """\
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
"""


def epilog_examples() -> list[str]:
    """Every example line of every epilog, continuation lines joined, each once, in order."""
    parser = build_parser(every=True)
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines: list[str] = []
    for epilog in [parser.epilog, *(p.epilog for p in subs.choices.values())]:
        block = (epilog or "").split("examples:\n", 1)[-1].split("\n\n", 1)[0]
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#\s.*$", "", " ".join(line.split()))
            if line and line not in lines:
                lines.append(line)
    return lines


def _make_inputs(here: Path) -> None:
    """What the examples name besides the demo's runs."""
    import numpy as np
    import torch

    from stepscope.history import HistoryWriter, RunRecord

    for rank in range(2):
        record = RunRecord.new(run_id="ddp", rank=rank, world_size=2)
        with HistoryWriter(here / "runs" / "ddp" / f"rank{rank:03d}", record) as writer:
            for step in range(3):
                writer.write_scalar("train/loss", step, 1.0 / (step + 1 + rank))
    (here / "model.py").write_text(MODEL)
    namespace: dict[str, object] = {}
    exec(compile(MODEL, "model.py", "exec"), namespace)
    model = namespace["build"]()  # type: ignore[operator]
    (here / "ckpt").mkdir()
    torch.save(model.state_dict(), here / "ckpt" / "e10.pt")
    g = np.random.default_rng(0)
    np.savez(here / "probe.npz", x=g.normal(size=(8, 4)).astype("float32"), y=g.integers(0, 3, 8))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(torch.randn(16, 4)).sum().backward()
    prof.export_chrome_trace(str(here / "trace.json"))
    with open(here / "trace.json", "rb") as src, gzip.open(here / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)


def _clean_environ() -> dict[str, str]:
    """This process's environment without the test suite's run root (a newcomer has none)."""
    return {k: v for k, v in os.environ.items() if k != "STEPSCOPE_DIR"}


def _shell_env(here: Path) -> dict[str, str]:
    """``stepscope`` and ``python`` on the PATH: this interpreter with this checkout's sources."""
    bin_dir = here / ".bin"
    bin_dir.mkdir()
    for name, run in (
        ("stepscope", f'"{sys.executable}" -m stepscope'),
        ("python", sys.executable),
    ):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec {run} "$@"\n')
        (bin_dir / name).chmod(0o755)
    return {
        **_clean_environ(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }


def _run_line(line: str, here: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = line + (DEMO_QUICK if line.startswith("stepscope demo") else "")
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_epilogs_name_only_known_kinds_of_line():
    lines = epilog_examples()
    assert lines[0].startswith("stepscope demo")  # the first line makes the runs the rest read
    others = [ln for ln in lines if not ln.startswith("stepscope ")]
    assert all(any(ln.startswith(p) for p in NOT_STEPSCOPE) for ln in others), others
    for prefix in KNOWN_RERUN_REFUSALS:
        assert any(ln.startswith(prefix) for ln in lines), prefix  # a stale entry goes


def test_every_epilog_example_runs_as_printed_twice(tmp_path):
    here = tmp_path / "newcomer"
    here.mkdir()
    _make_inputs(here)
    env = _shell_env(here)
    lines = [ln for ln in epilog_examples() if ln.startswith("stepscope ")]
    failures = []
    for attempt in (1, 2):
        for line in lines:
            done = _run_line(line, here, env)
            known = next((v for k, v in KNOWN_RERUN_REFUSALS.items() if line.startswith(k)), None)
            if attempt == 2 and known is not None:
                if done.returncode != 3 or f"refused [{known[0]}]" not in done.stderr:
                    failures.append((attempt, line, "expected", known[0], done.stderr[-800:]))
                continue
            if done.returncode or "Traceback" in done.stderr or "refused [" in done.stderr:
                failures.append((attempt, line, done.returncode, done.stderr[-1500:]))
    assert failures == []
    # what the epilogs promise exists: the demo's runs as a folder, a report, a TensorBoard export
    assert [p.name for p in (here / "runs" / "demo").glob("*-seed*")] == ["plain-seed0"]
    assert (here / "report.html").stat().st_size > 0
    # one event file per exported name, however often the examples ran: nothing doubled
    events = sorted(p.parent.name for p in (here / "tb").glob("*/events.out.tfevents.*"))
    assert events == ["baseline", "plain-seed0"], events


def _doc_blocks() -> dict[str, str]:
    """``{stem_index: code}`` for the README's first python block and every docs block."""
    out = {}
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", md.read_text(), re.S)):
            out[f"{md.stem}_{i}"] = code
    return out


def _self_contained(blocks: dict[str, str], folder: Path) -> list[str]:
    """The blocks in which ruff finds no undefined name (F821)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff (the dev extra) is needed to tell a self-contained block")
    for name, code in blocks.items():
        (folder / f"{name}.py").write_text(code)
    done = subprocess.run(
        [
            ruff,
            "check",
            "--no-cache",
            "--isolated",
            "--select",
            "F821",
            "--output-format",
            "concise",
            str(folder),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    undefined = {Path(ln.split(":", 1)[0]).stem for ln in done.stdout.splitlines() if "F821" in ln}
    return [n for n in blocks if n not in undefined]


RUNNER = """\
import os, sys, traceback, runpy
names, here = sys.argv[2:], sys.argv[1]
os.chdir(here)
bad = 0
for attempt in (1, 2):
    for name in names:
        try:
            runpy.run_path(os.path.join(sys.argv[1], ".blocks", name + ".py"), run_name="__main__")
        except BaseException:
            bad += 1
            print(f"FAILED {attempt} {name}", file=sys.stderr)
            traceback.print_exc()
sys.exit(1 if bad else 0)
"""


def test_the_readme_quickstart_and_the_self_contained_docs_examples_run_twice(tmp_path):
    here = tmp_path / "newcomer"
    (here / ".blocks").mkdir(parents=True)
    blocks = _doc_blocks()
    assert "README_0" in blocks
    assert set(NOT_SELF_CONTAINED) <= set(blocks)  # a stale entry goes
    names = [n for n in _self_contained(blocks, here / ".blocks") if n not in NOT_SELF_CONTAINED]
    assert names[0] == "README_0" and len(names) >= 10, names
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(here), *names],
        cwd=here,
        env={**_clean_environ(), "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    failed = [ln for ln in done.stderr.splitlines() if ln.startswith("FAILED ")]
    assert done.returncode == 0, (failed, textwrap.shorten(done.stderr[-3000:], 3000))
    assert "refused [" not in done.stderr and "Traceback" not in done.stderr

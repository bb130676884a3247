"""The trainer integrations say where a run records through ``logging``, never ``print()``.

A fresh interpreter per case (the logger's console handler is chosen at import, like Lightning's):
with no logging configured the line is on stderr and stdout stays clean; an application's
configuration (format, level) governs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

START = """
import torch
from stepscope.integrations.trainer import TrainerWatch
import stepscope as ss

def start(folder):
    s = TrainerWatch(settings=ss.WatchSettings(durable=False))
    s.start(torch.nn.Linear(3, 2), default_dir=folder, trainer_step=0, rank=0)
    s.close()
"""


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=True,
    )


def test_the_run_directory_is_announced_on_stderr_by_logging(tmp_path):
    done = _run(START + "start('runs/a')\n", tmp_path)
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith("stepscope: run ")
    assert done.stderr.splitlines()[-1].endswith("recording to runs/a/version_0")


def test_the_applications_logging_configuration_governs_the_announcement(tmp_path):
    done = _run(
        "import logging\n"
        "logging.basicConfig(level=logging.INFO, format='LOGGED %(levelname)s %(name)s %(message)s')\n"
        + START
        + "start('runs/a')\n"
        "logging.getLogger('stepscope').setLevel(logging.WARNING)\n"
        "start('runs/b')\n",
        tmp_path,
    )
    assert done.stdout == ""
    said = [ln for ln in done.stderr.splitlines() if "recording to" in ln]
    assert len(said) == 1 and said[0].endswith("recording to runs/a/version_0")
    assert said[0].startswith("LOGGED INFO stepscope.integrations.trainer stepscope: run ")

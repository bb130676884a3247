"""Test-wide fixtures: runs without an ``output_dir`` never land in the repository.

A collector given no exact ``output_dir`` writes a new ``version_<N>`` under ``$STEPSCOPE_DIR``
(default ``./runs``); every test gets its own empty temporary ``STEPSCOPE_DIR``, and the
variable is set for the whole session first, so doctests and subprocesses inherit one too.
"""

from __future__ import annotations

import os
import tempfile

import pytest

ENV_ROOT = "STEPSCOPE_DIR"  # stepscope.history.versions.ENV_ROOT (a test checks they agree)

os.environ[ENV_ROOT] = tempfile.mkdtemp(prefix="stepscope-tests-")


@pytest.fixture(autouse=True)
def _stepscope_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Point ``$STEPSCOPE_DIR`` at a fresh temporary folder for each test."""
    monkeypatch.setenv(ENV_ROOT, str(tmp_path_factory.mktemp("stepscope_dir")))

"""Shared helpers for the profiling tests: where the recorded Kineto fixtures live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def fixture_dir() -> Path | None:
    """``$STEPSCOPE_FIXTURES`` (a folder holding ``kineto/`` or the kineto folder itself), else
    ``<repo>/../shared/fixtures/kineto``; ``None`` when neither exists."""
    env = os.environ.get("STEPSCOPE_FIXTURES")
    candidates = []
    if env:
        candidates += [Path(env) / "kineto", Path(env)]
    candidates.append(REPO_ROOT.parent / "shared" / "fixtures" / "kineto")
    for path in candidates:
        if (path / "cpu_only.json.gz").is_file():
            return path
    return None


@pytest.fixture(scope="session")
def kineto_fixtures() -> Path:
    path = fixture_dir()
    if path is None:
        pytest.skip(
            "recorded Kineto traces not found: set STEPSCOPE_FIXTURES or place them in "
            "../shared/fixtures/kineto next to the checkout"
        )
    return path

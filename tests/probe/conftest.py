"""Make the probe test kit (tiny models, float64 oracle) importable under importlib mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from probe_testkit import brute_force


@pytest.fixture
def oracle():
    """The brute-force float64 per-example reference."""
    return brute_force

"""The probe test kit's float64 oracle as a fixture."""

from __future__ import annotations

import pytest

from tests.probe.probe_testkit import brute_force


@pytest.fixture
def oracle():
    """The brute-force float64 per-example reference."""
    return brute_force

"""Curvature tests: one thread, and the transformer test kit (models, float64 oracles) of
``tests/probe`` on the import path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "probe"))


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors on a shared 2-core box run ~10x faster without intra-op thread contention."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)

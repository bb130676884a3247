"""Curvature tests run on one thread (the transformer test kit they share with the probe tests is
imported as ``tests.probe.transformer_testkit``)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors on a shared 2-core box run ~10x faster without intra-op thread contention."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)

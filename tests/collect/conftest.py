"""The collector test kit's small network as a fixture."""

import pytest
import torch

from tests.collect.collect_testkit import SmallNet


@pytest.fixture
def small_net():
    torch.manual_seed(0)
    return SmallNet()

"""Make the collector test kit importable under importlib mode."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from collect_testkit import SmallNet


@pytest.fixture
def small_net():
    torch.manual_seed(0)
    return SmallNet()

"""Make the run-log test kit importable under importlib mode; the training-loop fixture."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from runlog_testkit import train


@pytest.fixture
def sdnet_train():
    return train

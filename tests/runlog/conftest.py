"""The run-log test kit's training loop as a fixture."""

import pytest

from tests.runlog.runlog_testkit import train


@pytest.fixture
def sdnet_train():
    return train

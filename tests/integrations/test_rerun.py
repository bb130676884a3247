"""The trainer callbacks run twice in one folder, with the real frameworks.

``Trainer(callbacks=[StepscopeCallback()])`` run a second time with the same
``default_root_dir`` / ``output_dir`` once refused ``history_run_exists`` at ``on_train_start``.
Each run is now a new ``stepscope/version_<N>``, and each holds that run's steps.
"""

from __future__ import annotations

import pytest

import stepscope as ss
from stepscope.history import find_runs


def test_lightning_twice_in_one_folder_writes_two_versions(tmp_path):
    pytest.importorskip("lightning")
    from stepscope.integrations.lightning import StepscopeCallback
    from tests.integrations.test_lightning import STEPS_PER_EPOCH, fit

    for _ in range(2):
        fit(tmp_path, [StepscopeCallback(settings=ss.WatchSettings(durable=False))], epochs=1)
    runs = find_runs(tmp_path / "stepscope")
    assert [p.name for p in runs] == ["version_0", "version_1"]
    for p in runs:
        assert ss.open_run(p).steps.tolist() == list(range(STEPS_PER_EPOCH))
    assert ss.open_run(tmp_path / "stepscope").path == runs[-1]  # the folder: newest version


def test_hugging_face_twice_in_one_output_dir_writes_two_versions(tmp_path):
    pytest.importorskip("transformers")
    from stepscope.integrations.transformers import StepscopeCallback
    from tests.integrations.test_transformers import STEPS_PER_EPOCH, train

    for _ in range(2):
        train(tmp_path, [StepscopeCallback(settings=ss.WatchSettings(durable=False))], epochs=1)
    runs = find_runs(tmp_path / "stepscope")
    assert [p.name for p in runs] == ["version_0", "version_1"]
    for p in runs:
        assert ss.open_run(p).steps.tolist() == list(range(STEPS_PER_EPOCH))

"""A TensorBoard export goes to ``<log dir>/<run name>`` and nowhere else, even with ``overwrite``.

The run name is the run's folder name by default (never its hex id) or ``--name``; ``overwrite``
deletes the run's export folder before writing, so a name that is not a path of folder names
below the log directory (``..``, ``.``, ``a//b``, two levels up) would point that deletion at the
log directory itself or its parent. Such a name refuses ``export_run_name_invalid`` and nothing on
disk changes.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.cli import main
from stepscope.errors import Refusal
from stepscope.events import export_run
from stepscope.history import HistoryWriter, ObservationBatch, RunRecord, StepBlockRecord
from stepscope.stats import SPINE_WIDTH


def _run(path, run_id="9f3c2a1b"):
    with HistoryWriter(path, RunRecord.new(run_id=run_id), durable=False) as w:
        site = w.register_site("fc", "torch.nn.Linear", "f32[4]")
        spines = np.zeros((1, SPINE_WIDTH))
        w.write_step(
            StepBlockRecord(0), [ObservationBatch.observed("activation", "forward", [site], spines)]
        )


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("name", ["..", ".", "a//b", "../../x", "a/../.."])
def test_a_name_that_is_not_a_path_of_folder_names_refuses_and_deletes_nothing(tmp_path, name):
    _run(tmp_path / "run")
    log_dir = tmp_path / "tb"
    (log_dir / "other-run").mkdir(parents=True)
    (log_dir / "other-run" / "events.out").write_text("another run's export")
    (tmp_path / "keep.txt").write_text("beside the log dir")
    before = _tree(tmp_path)
    with pytest.raises(Refusal) as err:
        export_run(tmp_path / "run", tensorboard=log_dir, overwrite=True, name=name)
    assert err.value.code == "export_run_name_invalid"
    assert "--name" in err.value.remedies[0]
    assert _tree(tmp_path) == before


def test_a_run_exports_into_a_folder_named_after_its_own_folder_not_its_id(tmp_path):
    _run(tmp_path / "plain-seed0")
    log_dir = tmp_path / "tb"
    (log_dir / "other-run").mkdir(parents=True)
    export_run(tmp_path / "plain-seed0", tensorboard=log_dir, overwrite=True)
    assert sorted(p.name for p in log_dir.iterdir()) == ["other-run", "plain-seed0"]
    assert any((log_dir / "plain-seed0").iterdir())


def test_a_versioned_run_keeps_its_parents_name_and_name_overrides_it(tmp_path, capsys):
    _run(tmp_path / "runs" / "exp" / "version_3")
    log_dir = tmp_path / "tb"
    export_run(tmp_path / "runs" / "exp" / "version_3", tensorboard=log_dir)
    assert any((log_dir / "exp" / "version_3").iterdir())
    args = ["export", str(tmp_path / "runs" / "exp" / "version_3"), "--tensorboard", str(log_dir)]
    assert main([*args, "--name", "baseline"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in log_dir.iterdir()) == ["baseline", "exp"]

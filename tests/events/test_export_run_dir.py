"""A TensorBoard export goes to ``<log dir>/<run_id>`` and nowhere else, even with ``overwrite``.

A run id is free text (``RunRecord`` accepts ``".."``), and ``overwrite=True`` deletes the run's
export folder before writing: a run id that is not one folder name would point that deletion at
the log directory itself or its parent. Such an id refuses ``export_run_name_invalid`` and nothing
on disk changes.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.errors import Refusal
from stepscope.events import export_run
from stepscope.history import ArtifactWriter, ObservationBatch, RunRecord, StepBlockRecord
from stepscope.stats import SPINE_WIDTH


def _run(path, run_id):
    with ArtifactWriter(path, RunRecord.new(run_id=run_id), durable=False) as w:
        site = w.register_site("fc", "torch.nn.Linear", "f32[4]")
        spines = np.zeros((1, SPINE_WIDTH))
        w.write_step(
            StepBlockRecord(0), [ObservationBatch.observed("activation", "forward", [site], spines)]
        )


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("run_id", ["..", ".", "a/b", "../../x"])
def test_a_run_id_that_is_not_one_folder_name_refuses_and_deletes_nothing(tmp_path, run_id):
    _run(tmp_path / "run", run_id)
    log_dir = tmp_path / "tb"
    (log_dir / "other-run").mkdir(parents=True)
    (log_dir / "other-run" / "events.out").write_text("another run's export")
    (tmp_path / "keep.txt").write_text("beside the log dir")
    before = _tree(tmp_path)
    with pytest.raises(Refusal) as err:
        export_run(tmp_path / "run", tensorboard=log_dir, overwrite=True)
    assert err.value.code == "export_run_name_invalid"
    assert _tree(tmp_path) == before


def test_a_plain_run_id_exports_into_its_own_folder(tmp_path):
    _run(tmp_path / "run", "run-1")
    log_dir = tmp_path / "tb"
    (log_dir / "other-run").mkdir(parents=True)
    export_run(tmp_path / "run", tensorboard=log_dir, overwrite=True)
    assert sorted(p.name for p in log_dir.iterdir()) == ["other-run", "run-1"]
    assert any((log_dir / "run-1").iterdir())

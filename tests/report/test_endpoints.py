"""Default endpoints include a final evaluation logged after the last probe step."""

from __future__ import annotations

import pytest

from stepscope import open_run
from stepscope.history import HistoryWriter, RunRecord, StepBlockRecord
from stepscope.report.endpoints import default_endpoints, endpoints_section
from stepscope.report.model import Table


def _run(path, probe_steps, eval_steps):
    w = HistoryWriter(path, RunRecord.new(run_id="ends"), commit_steps=1, durable=False)
    for step in range(7):
        w.write_step(StepBlockRecord(step, examples_seen=8 * (step + 1)), scalars={"loss": 1.0})
    for step in probe_steps:
        w.write_scalar("probe/axes/examples_seen", step, 8.0 * (step + 1))
        w.write_scalar("probe/model/accuracy_fraction", step, 0.5)
    for step in eval_steps:
        w.write_scalar("eval/validation/accuracy_fraction", step, 0.25)
    w.close()
    return open_run(path)


@pytest.mark.parametrize(
    ("probe_steps", "eval_steps", "want"),
    [
        ((0, 2, 4, 5), (2, 6), [2, 6]),  # a final evaluation at step N after the last probe
        ((0, 2, 4, 5), (6,), [0, 5, 6]),  # no common step: the final evaluation still counts
        ((0, 3, 6), (0, 3, 6), [0, 6]),  # the common case is unchanged
        ((0, 3), (), [0, 3]),
    ],
)
def test_default_endpoints_include_the_final_evaluation(tmp_path, probe_steps, eval_steps, want):
    view = _run(tmp_path / "run", probe_steps, eval_steps)
    assert default_endpoints([view]) == want
    if eval_steps:  # and the gap table shows the final evaluation's value there
        (table,) = [i for i in endpoints_section([view], want).items if isinstance(i, Table)]
        last = next(r for r in table.rows if r[1] == str(eval_steps[-1]))
        assert last[4] == "0.25"

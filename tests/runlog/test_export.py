"""Exports carry the run log: every row reaches the JSONL tracker with its value and axes."""

import json

from stepscope.events.export import export_run
from stepscope.runlog import RunLog


def test_jsonl_export_carries_scalars_clocks_branches_and_evals(tmp_path, sdnet_train):
    rl = RunLog(tmp_path / "run", durable=False)
    truth = sdnet_train(lambda m, o: (rl, lambda n, e: rl.step(examples=n, epoch=e)))
    rl.close()
    view = _view_of(tmp_path / "run")
    export_run(tmp_path / "run", jsonl=tmp_path / "out.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    got = {(e["name"], e["optimizer_step"]): e for e in lines if e["kind"] == "scalar"}
    names = [
        "loss",
        "lr",
        "branch/blocks.1/survival_probability",
        "branch/blocks.1/active_fraction",
        "branch/blocks.2/nominal_skipped_macs",
        "clock/training_seconds",
        "clock/telemetry_seconds",
        "clock/elapsed_seconds",
        "eval/validation/ce",
        "eval/test/ce",
    ]
    for name in names:
        s = view.scalar(name)
        exported = [got[(name, step)]["value"] for step in s.steps.tolist()]
        assert exported == s.values.tolist(), name
    assert [got[("loss", s)]["value"] for s in range(12)] == [truth.loss[s] for s in range(12)]
    assert got[("lr", 5)]["examples_seen"] == 96 and got[("lr", 5)]["epoch"] == 1


def _view_of(path):
    from stepscope import open_run

    return open_run(path).view()

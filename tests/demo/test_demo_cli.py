"""``stepscope demo`` runs the study end to end and leaves artifacts a reader can use."""

import json
import subprocess
import sys

import pytest

import stepscope as ss
from stepscope.cli import main

VARIANTS = ("plain", "residual")


def test_quick_study_writes_verified_artifacts_probe_rows_evals_and_curvature(tmp_path, capsys):
    pytest.importorskip("mlxtend")
    out = tmp_path / "demo"
    assert (
        main(
            ["demo", "--quick", "--variants", "plain", "residual", "--out", str(out), "--no-report"]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "activation spines" in text and "0 (exact)" in text
    for variant in ("plain", "residual"):
        run = out / f"{variant}-seed0"
        h = ss.open_run(run)
        assert h.verify().ok  # every committed chunk re-hashes to its index row
        steps = h.steps
        assert len(steps) == 110 and steps[0] == 0  # 2 epochs x 55 steps, every step recorded
        loss = h.scalars("train/loss")
        assert len(loss.values) == 110 and loss.valid.all()
        # the probe ran on its cadence (every 10 steps) and wrote its rows at step + 1
        acc = h.scalars("probe/model/accuracy_fraction")
        # the probe's own helper chose its cadence (<= 5% overhead, recorded in the run record);
        # it ran at step 0, after every k-th step, and after each epoch's last step (with evals)
        decision = h.run.extra["probe_cadence"]
        assert decision["target_overhead"] == 0.05 and decision["dtype"] == "float32"
        every = decision["cadence_steps"] or 55
        if decision["cadence_steps"] is not None:
            assert decision["expected_overhead"] <= 0.05
        acc = h.scalars("probe/model/accuracy_fraction")
        assert list(acc.steps) == sorted({0, *range(1, 111, every), 55, 110})
        # three curvature checkpoints, each a JSON with the per-layer families
        files = sorted((run / "curvature").glob("curvature-*.json"))
        assert [f.name for f in files] == [
            "curvature-000.json",
            "curvature-001.json",
            "curvature-002.json",
        ]
        payload = json.loads(files[-1].read_text())
        assert payload["epoch"] == 2 and payload["checkpoint"]["sha256"]
        layer = next(iter(payload["analysis"]["layers"].values()))
        assert {"empirical_fisher", "ce_ggn", "jacobian_gram"} <= set(layer)
    # stochastic depth in the residual variant: realised activity is logged per block, and a
    # block that did not run has its gradient cells recorded not_scheduled, never as zeros
    h = ss.open_run(out / "residual-seed0")
    branches = sorted({n.split("/")[1] for n in h.scalar_names if n.startswith("branch/")})
    assert len(branches) == 5
    skipped_and_scheduled = 0
    for b in branches:
        active = h.scalars(f"branch/{b}/active_fraction")
        assert set(active.values.tolist()) <= {0.0, 1.0} and 0.5 < active.values.mean() < 1.0
        grad = h.series(f"{b}.block.0.weight", "gradient", "total")
        presence = dict(zip(grad.steps.tolist(), grad.presence_names().tolist()))
        for step in active.steps[active.values == 0].tolist():
            if step in presence:  # a gradient step (every 10th) on which the block was skipped
                assert presence[step] == "not_scheduled"
                skipped_and_scheduled += 1
    assert skipped_and_scheduled > 0
    # one probe for the whole study: every run probed the same examples (identity persisted)
    identities = [json.loads((out / f"{v}-seed0" / "probe.json").read_text()) for v in VARIANTS]
    assert len({i["sha256"] for i in identities}) == 1
    assert identities[0]["indices"] == identities[1]["indices"] and identities[0]["count"] == 64
    for variant in VARIANTS:
        run = out / f"{variant}-seed0"
        record = json.loads((run / "telemetry.json").read_text())
        runlog = json.loads((run / "runlog.json").read_text())
        outside = [
            "probe_seconds",
            "probe_serialization_seconds",
            "update_snapshot_seconds",
            "checkpoint_seconds",
        ]
        assert all(record[k] > 0 for k in outside)
        # the probe, its serialisation, snapshots and checkpoints are on the telemetry clock
        assert runlog["telemetry_seconds"] >= sum(record[k] for k in outside)
        assert record["telemetry_seconds"] == runlog["telemetry_seconds"]
        assert record["overall_telemetry_fraction"] == pytest.approx(
            runlog["telemetry_seconds"] / runlog["training_seconds"]
        )
        assert record["counts"]["probe_seconds"] == len(
            ss.open_run(run).scalars("probe/model/loss").steps
        )
        qual = record["cadence_qualification"]["measurements"]
        assert min(qual["serialization_seconds"]) > 0  # qualification charged serialisation
        # evaluation splits carry confusion matrices; the panel checked the recorder's probe
        h = ss.open_run(run)
        cells = [n for n in h.scalar_names if n.startswith("eval/validation/confusion/")]
        assert len(cells) == 100
        done = json.loads((run / "curvature" / "result.json").read_text())
        assert done["pins"]["recorder_probe_sha256"] == identities[0]["sha256"]
        last = json.loads((run / "curvature" / "curvature-002.json").read_text())
        assert last["optimizer_step"] == 110 and last["code"]["stepscope_version"]


def test_module_entry_point_lists_commands():
    res = subprocess.run(
        [sys.executable, "-m", "stepscope", "--help"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and "demo" in res.stdout


def test_invalid_configuration_refuses_with_exit_code_3(tmp_path, capsys):
    assert main(["demo", "--epochs", "0", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "run_config_invalid" in err

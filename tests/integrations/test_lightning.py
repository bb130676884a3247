"""The Lightning callback against a real ``lightning.pytorch.Trainer`` on CPU.

Two epochs of a small CNN (Conv, BatchNorm, Dropout, Linear), ``accumulate_grad_batches=2``,
validation every epoch. Each test compares what stepscope recorded with an independent callback
reading the framework's own state, or with the same Trainer run without stepscope.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import stepscope as ss
from stepscope.cli import main
from stepscope.integrations import ProbePlan
from stepscope.integrations.lightning import StepscopeCallback
from stepscope.integrations.trainer import PROBE_TIMING_STEPS
from tests.integrations.integrations_testkit import (
    assert_gradients_match,
    grad_facts,
    optimizer_state_equal,
    recorded_gradients,
    state_equal,
)

BATCHES, BATCH, ACCUMULATE, EPOCHS = 5, 8, 2, 2
STEPS_PER_EPOCH = (BATCHES + ACCUMULATE - 1) // ACCUMULATE  # 2 + 2 + the epoch's last batch
DDP_SCRIPT = Path(__file__).with_name("lightning_ddp_script.py")


class TinyCNN(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.2)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(h).flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)}


def loaders() -> tuple[DataLoader, DataLoader]:
    g = torch.Generator().manual_seed(1)
    n = BATCHES * BATCH
    train = TensorDataset(
        torch.randn(n, 1, 6, 6, generator=g), torch.randint(0, 5, (n,), generator=g)
    )
    val = TensorDataset(
        torch.randn(12, 1, 6, 6, generator=g), torch.randint(0, 5, (12,), generator=g)
    )
    return DataLoader(train, batch_size=BATCH), DataLoader(val, batch_size=6)


class Oracle(pl.Callback):
    """Independent record: the gradient at ``on_before_optimizer_step``, each micro-batch's loss."""

    def __init__(self) -> None:
        self.grads: list[dict] = []
        self.losses: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads.append(grad_facts(pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(outputs["loss"].item())


def fit(root: Path, callbacks: list, *, epochs: int = EPOCHS, ckpt_path: str | None = None, **kw):
    torch.manual_seed(0)
    model = TinyCNN()
    trainer = pl.Trainer(
        max_epochs=epochs,
        accumulate_grad_batches=ACCUMULATE,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=kw.pop("enable_checkpointing", False),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=kw.pop("num_sanity_val_steps", 0),
        default_root_dir=str(root),
        callbacks=callbacks,
        **kw,
    )
    train, val = loaders()
    trainer.fit(model, train, val, ckpt_path=ckpt_path)
    return trainer, model


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("pl")
    oracle = Oracle()
    cb = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    trainer, model = fit(root, [cb, oracle], num_sanity_val_steps=1)
    return {
        "run": str(root / "stepscope" / "version_0"),
        "oracle": oracle,
        "model": model,
        "trainer": trainer,
        "rng": torch.get_rng_state(),
    }


def test_gradient_rows_equal_the_gradient_the_optimizer_consumed(recorded):
    assert len(recorded["oracle"].grads) == EPOCHS * STEPS_PER_EPOCH
    assert_gradients_match(recorded["oracle"].grads, recorded["run"])


def test_steps_carry_micro_batches_examples_and_epochs(recorded):
    blocks = ss.open_run(recorded["run"]).step_blocks()
    per_epoch = [2, 2, 1]  # 5 batches, accumulate 2: Lightning steps on the epoch's last batch
    assert [b.truth.micro_batches for b in blocks] == per_epoch * EPOCHS
    examples = np.cumsum([m * BATCH for m in per_epoch * EPOCHS]).tolist()
    assert [b.examples_seen for b in blocks] == examples
    assert [b.epoch for b in blocks] == [0] * 3 + [1] * 3
    assert {b.truth.clipped.value for b in blocks} == {"no"}
    assert {b.truth.applied.value for b in blocks} == {"yes"}


def test_validation_rows_carry_their_split_and_coordinates(recorded):
    evals = ss.open_run(recorded["run"]).evals()
    assert [e.split for e in evals] == ["validation"] * EPOCHS  # the sanity check is not one
    assert [e.optimizer_step for e in evals] == [STEPS_PER_EPOCH * (i + 1) for i in range(EPOCHS)]
    assert [e.epoch for e in evals] == list(range(EPOCHS))
    assert {e.sample_count for e in evals} == {12}
    assert set(evals[-1].metrics) == {"val_loss", "val_acc"}
    final = recorded["trainer"].callback_metrics
    assert evals[-1].metrics["val_loss"] == pytest.approx(float(final["val_loss"]))


def test_loss_and_learning_rate_are_run_scalars(recorded):
    reader = ss.open_run(recorded["run"])
    losses = recorded["oracle"].losses  # one per micro-batch, already divided by ACCUMULATE
    sizes = [2, 2, 1] * EPOCHS
    expected = [sum(losses[sum(sizes[:i]) : sum(sizes[: i + 1])]) for i in range(len(sizes))]
    np.testing.assert_allclose(reader.scalars("train/loss").values, expected, rtol=1e-6)
    lr = reader.scalars("train/lr").values  # StepLR(step_size=2, gamma=0.5) per epoch
    np.testing.assert_allclose(lr, [1e-2] * 6, rtol=0)


def test_observation_is_bitwise_pure(recorded, tmp_path):
    control = Oracle()
    trainer, model = fit(tmp_path, [control], num_sanity_val_steps=1)
    assert torch.equal(torch.get_rng_state(), recorded["rng"])  # no extra random draws
    assert control.losses == recorded["oracle"].losses
    assert state_equal(model.state_dict(), recorded["model"].state_dict())  # BatchNorm too
    assert optimizer_state_equal(
        trainer.optimizers[0].state_dict(), recorded["trainer"].optimizers[0].state_dict()
    )


def test_gradient_clipping_is_declared(tmp_path):
    cb = StepscopeCallback(settings=ss.WatchSettings(durable=False))
    fit(tmp_path, [cb], epochs=1, gradient_clip_val=0.5)
    blocks = ss.open_run(tmp_path / "stepscope" / "version_0").step_blocks()
    assert {b.truth.clipped.value for b in blocks} == {"yes"}


def test_fit_stop_resume_is_one_artifact_with_ancestry(tmp_path):
    run = tmp_path / "stepscope" / "version_0"
    first = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    fit(tmp_path, [first], epochs=1, enable_checkpointing=True)
    (ckpt,) = (tmp_path / "checkpoints").glob("*.ckpt")
    second = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    oracle = Oracle()
    fit(tmp_path, [second, oracle], epochs=2, ckpt_path=str(ckpt))
    reader = ss.open_run(run)
    assert reader.steps.tolist() == list(range(EPOCHS * STEPS_PER_EPOCH))
    parent, child = reader.segments
    assert child.parent_segment == parent.segment_id
    assert child.resumed_at_step == STEPS_PER_EPOCH
    assert child.run_id == parent.run_id
    blocks = reader.step_blocks()
    assert [b.epoch for b in blocks] == [0] * 3 + [1] * 3
    assert main(["verify", str(run)]) == 0


def test_resumed_segment_continues_examples_seen(tmp_path):
    fit(
        tmp_path,
        [StepscopeCallback(settings=ss.WatchSettings(durable=False))],
        epochs=1,
        enable_checkpointing=True,
    )
    (ckpt,) = (tmp_path / "checkpoints").glob("*.ckpt")
    cb = StepscopeCallback(settings=ss.WatchSettings(durable=False))
    fit(tmp_path, [cb], epochs=2, ckpt_path=str(ckpt))
    blocks = ss.open_run(tmp_path / "stepscope" / "version_0").step_blocks()
    per_epoch = [2, 2, 1]
    assert [b.examples_seen for b in blocks] == np.cumsum(
        [m * BATCH for m in per_epoch * EPOCHS]
    ).tolist()


def test_resume_from_an_earlier_checkpoint_rewinds_to_its_step(tmp_path):
    """Steps recorded after the checkpoint (a crash later) are superseded, never duplicated."""
    every3 = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ck", every_n_train_steps=3, save_top_k=-1
    )
    cb = StepscopeCallback(settings=ss.WatchSettings(durable=False))
    fit(tmp_path, [cb, every3], epochs=2, max_steps=5, enable_checkpointing=True)
    ckpt = next((tmp_path / "ck").glob("*step=3*.ckpt"))
    cb2 = StepscopeCallback(settings=ss.WatchSettings(durable=False))
    fit(tmp_path, [cb2], epochs=2, ckpt_path=str(ckpt))
    reader = ss.open_run(tmp_path / "stepscope" / "version_0")
    assert reader.steps.tolist() == list(range(EPOCHS * STEPS_PER_EPOCH))
    assert reader.segments[-1].resumed_at_step == 3
    assert main(["verify", str(tmp_path / "stepscope" / "version_0")]) == 0


@pytest.mark.slow
def test_ddp_two_ranks_write_segments_that_merge_exactly(tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        # this checkout's sources first (not an installed copy), and its tests package
        "PYTHONPATH": os.pathsep.join(
            str(Path(__file__).resolve().parents[2] / d) for d in ("src", "")
        ),
    }
    done = subprocess.run(
        [sys.executable, str(DDP_SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (done.stdout + done.stderr).count("stepscope: run ") == 1  # rank 0 alone says where
    ranks = [tmp_path / "stepscope" / "version_0" / f"rank{r:03d}" for r in range(2)]
    readers = [ss.open_run(p) for p in ranks]
    assert [h.run.rank for h in readers] == [0, 1]
    assert len({h.run.run_id for h in readers}) == 1
    assert main(["merge", *map(str, ranks), "--out", str(tmp_path / "merged")]) == 0
    merged = ss.open_run(tmp_path / "merged")
    assert merged.steps.tolist() == readers[0].steps.tolist() == readers[1].steps.tolist()
    for site in ("conv.weight", "fc.weight", "bn"):
        stream = "activation" if site == "bn" else "gradient"
        for field in ("total", "finite", "zero", "negative"):
            want = sum(h.series(site, stream, field).values for h in readers)
            np.testing.assert_array_equal(merged.series(site, stream, field).values, want)
        np.testing.assert_allclose(
            merged.series(site, stream, "sum_squares").values,
            sum(h.series(site, stream, "sum_squares").values for h in readers),
            rtol=1e-12,
        )
    assert [b.examples_seen for b in merged.step_blocks()] == [
        2 * b.examples_seen for b in readers[0].step_blocks()
    ]


def test_dense_probe_runs_at_step_zero_then_on_its_cadence_and_stays_pure(tmp_path):
    train, _ = loaders()
    x, y = train.dataset.tensors
    probe = ss.DenseProbe(x, y, size=16, seed=3)
    reference = ss.DenseProbe(x, y, size=16, seed=3)
    torch.manual_seed(0)
    at_init = reference.measure(TinyCNN(), step=0, examples_seen=0, epoch=-1)
    every2 = StepscopeCallback(
        settings=ss.WatchSettings(durable=False), probe=ProbePlan(probe, every=2)
    )
    observed, control = Oracle(), Oracle()
    _, model = fit(tmp_path / "a", [every2, observed])
    _, control_model = fit(tmp_path / "b", [control])
    assert observed.losses == control.losses
    assert state_equal(model.state_dict(), control_model.state_dict())
    reader = ss.open_run(tmp_path / "a" / "stepscope" / "version_0")
    axes = ss.probe.read_probe_axes(reader)
    assert axes["optimizer_step"].tolist() == [0, 2, 4, 6]
    assert axes["examples_seen"].tolist() == [0, 32, 56, 80]
    n = reader.scalars("probe/model/n_examples")
    assert n.values.tolist() == [16.0] * 4
    at0 = {k: v for k, v in ss.probe.probe_scalar_rows(at_init).items() if "axes" not in k}
    for name, value in list(at0.items())[:20]:
        series = reader.scalars(name)
        assert series.steps[0] == 0
        assert series.values[0] == pytest.approx(value, rel=1e-6, abs=1e-9), name


def test_dense_probe_cadence_is_chosen_from_measured_times(tmp_path):
    train, _ = loaders()
    x, y = train.dataset.tensors
    cb = StepscopeCallback(
        settings=ss.WatchSettings(durable=False), probe=ss.DenseProbe(x, y, size=16, seed=3)
    )
    fit(tmp_path, [cb])
    plan = cb.watch.probe
    assert plan.decision is not None and plan.decision["target_overhead"] == 0.05
    assert plan.every == plan.decision["cadence_steps"] >= 1
    assert plan.decision["expected_overhead"] <= 0.05
    reader = ss.open_run(tmp_path / "stepscope" / "version_0")
    assert reader.scalars("probe/cadence_steps").values.tolist() == [float(plan.every)]
    overhead = reader.scalars("probe/expected_overhead").values.tolist()
    assert overhead == [pytest.approx(plan.decision["expected_overhead"], rel=1e-12)]
    probed = ss.probe.read_probe_axes(reader)["optimizer_step"].tolist()
    last = EPOCHS * STEPS_PER_EPOCH  # decided after PROBE_TIMING_STEPS timed steps
    after = [s for s in range(PROBE_TIMING_STEPS, last + 1) if s % plan.every == 0]
    assert probed == [0, *after]


class ScalerOracle(Oracle):
    """Also the scale in force and whether every gradient is finite (the scaler will step)."""

    def __init__(self) -> None:
        super().__init__()
        self.scales: list[float] = []
        self.finite: list[bool] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        super().on_before_optimizer_step(trainer, pl_module, optimizer)
        self.scales.append(trainer.precision_plugin.scaler.get_scale())
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.finite.append(all(bool(torch.isfinite(g).all()) for g in grads))


@pytest.fixture(scope="module")
def amp_run(tmp_path_factory) -> tuple[ScalerOracle, list, Path]:
    root = tmp_path_factory.mktemp("amp")
    # fp16 autocast on CPU with a GradScaler whose first scale overflows: steps skip and apply
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**18, growth_interval=1)
    plugin = pl.plugins.precision.MixedPrecision("16-mixed", "cpu", scaler=scaler)
    oracle = ScalerOracle()
    cb = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    fit(root, [cb, oracle], plugins=[plugin])
    return (
        oracle,
        ss.open_run(root / "stepscope" / "version_0").step_blocks(),
        root / "stepscope" / "version_0",
    )


def test_amp_scale_in_force_and_skipped_steps_are_recorded(amp_run):
    oracle, blocks, run = amp_run
    assert True in oracle.finite and False in oracle.finite  # the run exercises both
    assert [b.truth.scale for b in blocks] == oracle.scales
    assert [b.truth.applied.value for b in blocks] == ["yes" if f else "no" for f in oracle.finite]
    # Lightning unscales before the scaler decides: skipped steps' gradients are unscaled too
    assert {b.truth.unscaled.value for b in blocks} == {"yes"}
    applied = [i for i, f in enumerate(oracle.finite) if f]
    names = sorted(oracle.grads[0])  # skipped steps' gradients are read as left ("backward")
    recorded = recorded_gradients(str(run), names, phase="pre_step")
    for i in applied:  # what the optimizer consumed: unscaled gradients
        for name, want in oracle.grads[i].items():
            np.testing.assert_allclose(recorded[i][name][1:], want[1:], rtol=1e-5, atol=1e-7)


class TwoStepsPerBatch(TinyCNN):
    """Manual optimization that steps the optimizer twice per batch (global_step += 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        for _ in range(2):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss


def test_manual_optimization_stepping_twice_per_batch_records_each_optimizer_step(tmp_path):
    """It used to stop recording (integration_step_mismatch); each optimizer step is now a step
    (see docs/trainers.md), numbered as trainer.global_step counts them."""
    cb = StepscopeCallback(settings=ss.WatchSettings(durable=False), cadence=1)
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[cb],
    )
    train, _ = loaders()
    trainer.fit(TwoStepsPerBatch(), train)
    assert trainer.global_step == 2 * BATCHES  # training ran to the end
    reader = ss.open_run(tmp_path / "stepscope" / "version_0")
    assert reader.steps.tolist() == list(range(2 * BATCHES))
    blocks = reader.step_blocks()
    assert [b.truth.applied.value for b in blocks] == ["yes"] * (2 * BATCHES)
    assert [b.examples_seen for b in blocks] == [BATCH * (1 + i // 2) for i in range(2 * BATCHES)]

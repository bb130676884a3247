"""The Hugging Face callback against a real ``transformers.Trainer`` on CPU.

A GPT-2 built from a tiny config (no download: embeddings, tied head, attention, LayerNorm,
dropout), ``gradient_accumulation_steps=4``, evaluation every epoch, two epochs. Each test
compares what stepscope recorded with an independent callback or with the same Trainer run
without stepscope.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as tf

import stepscope as ss
from stepscope.cli import main
from stepscope.integrations.transformers import StepscopeCallback
from tests.hf_models import tiny_model
from tests.integrations.integrations_testkit import (
    assert_gradients_match,
    grad_facts,
    optimizer_state_equal,
    state_equal,
)

N_TRAIN, BATCH, ACCUMULATE, EPOCHS, N_EVAL = 40, 4, 4, 2, 8
MICRO = [4, 4, 2]  # 10 batches per epoch, accumulation 4: the epoch's last step has 2
STEPS_PER_EPOCH = len(MICRO)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Oracle(tf.TrainerCallback):
    """Independent record: the gradient at ``on_pre_optimizer_step`` and the Trainer's logs."""

    def __init__(self) -> None:
        self.grads: list[dict] = []
        self.logs: list[dict] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append(grad_facts(model))

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(
            {k: v for k, v in logs.items() if "runtime" not in k and "per_second" not in k}
        )


def train(root: Path, callbacks: list, *, epochs: int = EPOCHS, resume: str | None = None, **kw):
    torch.manual_seed(0)
    model = tiny_model("gpt2", width=32, vocab=64)
    args = tf.TrainingArguments(
        output_dir=str(root),
        num_train_epochs=epochs,
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATE,
        eval_strategy="epoch",
        logging_steps=1,
        report_to=[],
        save_strategy=kw.pop("save_strategy", "no"),
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        learning_rate=1e-3,
        **kw,
    )
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(N_TRAIN, 1),
        eval_dataset=Tokens(N_EVAL, 2),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer, model


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    oracle = Oracle()
    trainer, model = train(
        root, [StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False)), oracle]
    )
    return {
        "run": str(root / "stepscope" / "version_0"),
        "oracle": oracle,
        "model": model,
        "optimizer": trainer.optimizer.state_dict(),
        "rng": torch.get_rng_state(),
    }


def test_gradient_rows_equal_the_gradient_the_optimizer_consumed(recorded):
    assert len(recorded["oracle"].grads) == EPOCHS * STEPS_PER_EPOCH
    assert_gradients_match(recorded["oracle"].grads, recorded["run"])


def test_steps_carry_micro_batches_examples_epochs_and_clipping(recorded):
    blocks = ss.open_run(recorded["run"]).step_blocks()
    assert [b.truth.micro_batches for b in blocks] == MICRO * EPOCHS
    assert [b.examples_seen for b in blocks] == np.cumsum(
        [m * BATCH for m in MICRO * EPOCHS]
    ).tolist()
    assert [b.epoch for b in blocks] == [0] * 3 + [1] * 3
    assert {b.truth.clipped.value for b in blocks} == {"yes"}  # max_grad_norm=1.0 by default
    assert {b.truth.applied.value for b in blocks} == {"yes"}


def test_evaluation_rows_carry_their_split(recorded):
    evals = ss.open_run(recorded["run"]).evals()
    assert [e.split for e in evals] == ["validation"] * EPOCHS
    assert [e.optimizer_step for e in evals] == [3, 6]
    assert [e.epoch for e in evals] == [0, 1]
    assert {e.sample_count for e in evals} == {N_EVAL}
    logged = [log["eval_loss"] for log in recorded["oracle"].logs if "eval_loss" in log]
    assert [e.metrics["loss"] for e in evals] == logged
    assert all(set(e.metrics) == {"loss"} for e in evals)  # timing keys are not metrics


def test_the_trainers_logged_values_are_run_scalars(recorded):
    reader = ss.open_run(recorded["run"])
    train_logs = [log for log in recorded["oracle"].logs if "loss" in log]
    for key in ("loss", "grad_norm", "learning_rate"):
        series = reader.scalars(f"train/{key}")
        assert series.steps.tolist() == list(range(EPOCHS * STEPS_PER_EPOCH))
        np.testing.assert_allclose(series.values, [log[key] for log in train_logs], rtol=1e-7)
    lr = reader.scalars("train/lr")  # in force during the step == what the Trainer logs after it
    np.testing.assert_allclose(lr.values, [log["learning_rate"] for log in train_logs], rtol=1e-12)


def test_observation_is_bitwise_pure(recorded, tmp_path):
    control = Oracle()
    trainer, model = train(tmp_path, [control])
    assert torch.equal(torch.get_rng_state(), recorded["rng"])  # no extra random draws
    assert control.logs == recorded["oracle"].logs  # losses, grad norms, eval losses
    assert state_equal(model.state_dict(), recorded["model"].state_dict())
    assert optimizer_state_equal(trainer.optimizer.state_dict(), recorded["optimizer"])


@pytest.mark.slow
def test_train_stop_resume_is_one_artifact_with_ancestry(tmp_path):
    run = tmp_path / "stepscope" / "version_0"
    cb = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    train(tmp_path, [cb], epochs=1, save_strategy="epoch")
    ckpt = tmp_path / f"checkpoint-{STEPS_PER_EPOCH}"
    assert ckpt.is_dir()
    cb2 = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    oracle = Oracle()
    train(tmp_path, [cb2, oracle], epochs=2, resume=str(ckpt))
    reader = ss.open_run(run)
    assert reader.steps.tolist() == list(range(EPOCHS * STEPS_PER_EPOCH))
    parent, child = reader.segments
    assert (child.parent_segment, child.resumed_at_step) == (parent.segment_id, STEPS_PER_EPOCH)
    assert child.run_id == parent.run_id
    assert [b.epoch for b in reader.step_blocks()] == [0] * 3 + [1] * 3
    assert main(["verify", str(run)]) == 0
    names = sorted(oracle.grads[0])
    got = reader.series(names[0], "gradient", "sum_squares", steps=(3, 5))
    np.testing.assert_allclose(got.values, [g[names[0]][2] for g in oracle.grads], rtol=1e-5)


@pytest.mark.slow
def test_torchrun_two_ranks_write_segments_of_one_run_that_merge(tmp_path):
    script = Path(__file__).with_name("transformers_ddp_script.py")
    root = script.resolve().parents[2]  # this checkout's sources first, and its tests package
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{root / 'src'}{os.pathsep}{root}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*cmd, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=script.parent,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (done.stdout + done.stderr).count("stepscope: run ") == 1  # rank 0 alone says where
    ranks = [tmp_path / "stepscope" / "version_0" / f"rank{r:03d}" for r in range(2)]
    readers = [ss.open_run(p) for p in ranks]
    assert [(h.run.rank, h.run.world_size) for h in readers] == [(0, 2), (1, 2)]
    assert len({h.run.run_id for h in readers}) == 1
    per_rank = N_TRAIN // 2 // BATCH  # 5 batches per rank: steps of 4 and 1 micro-batches
    for h in readers:
        assert [b.truth.micro_batches for b in h.step_blocks()] == [
            ACCUMULATE,
            per_rank - ACCUMULATE,
        ]
    assert main(["merge", *map(str, ranks), "--out", str(tmp_path / "merged")]) == 0
    merged = ss.open_run(tmp_path / "merged")
    assert [b.examples_seen for b in merged.step_blocks()] == [2 * 16, 2 * 20]
    for field in ("total", "finite", "zero"):
        want = sum(h.series("lm_head", "activation", field).values for h in readers)
        np.testing.assert_array_equal(merged.series("lm_head", "activation", field).values, want)

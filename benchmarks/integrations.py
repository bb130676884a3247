"""Overhead of the trainer callbacks, side by side with each framework's own logger, in one run.

Run:  .venv/bin/python benchmarks/integrations.py [--steps 40] [--rounds 3] [--threads 1]

Model: a GPT-2 from a config (4 layers, width 128, 64 tokens, vocabulary 512, batch 8, AdamW),
CPU, no validation. Arms, per framework, each a fresh same-seed model and Trainer, run in turns
for ``--rounds`` rounds so machine drift hits all alike:

* Lightning: no logger (control); ``StepscopeCallback()`` at its default cadence (artifact on disk,
  fsync on); ``WandbLogger(offline=True)`` with Lightning's defaults (``log_every_n_steps=50``).
* Hugging Face: ``report_to=[]`` (control); ``StepscopeCallback()`` at its default cadence;
  ``report_to="tensorboard"`` with the Trainer's defaults (``logging_steps=500``).

A timing callback (last in the list) stamps each optimizer step's end; the first 3 steps of each
fit are warm-up, and one whole control fit before the rounds is discarded; the arms' order rotates
each round. Printed: per round, each arm's mean step time (which carries the default cadence's
every-10th parameter-sized steps) over the control's mean in the same round, and the median of
those ratios over rounds (on a shared machine a single round can be off by 50%); and, immune to
the machine's load because both are timed inside the same steps, stepscope's own
``clock/telemetry_seconds / clock/training_seconds`` of each stepscope fit.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch

WARMUP = 3
#: framework -> telemetry seconds / training seconds of each stepscope fit (the run's own clocks)
TELEMETRY: dict[str, list[float]] = {"lightning": [], "transformers": []}


def telemetry_fraction(run: str) -> float:
    """``clock/telemetry_seconds`` over ``clock/training_seconds`` at the run's last step."""
    import stepscope as ss

    reader = ss.open_run(run)
    tele = reader.scalars("clock/telemetry_seconds").values[-1]
    return float(tele / reader.scalars("clock/training_seconds").values[-1])


def gpt2(vocab: int = 512) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=128, n_layer=4, n_head=4, n_positions=64, vocab_size=vocab)
    return transformers.GPT2LMHeadModel(cfg)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 512, (n, 64), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


# ---------------------------------------------------------------------- Lightning
def lightning_arm(kind: str, steps: int, root: str) -> list[float]:
    import lightning.pytorch as pl

    from stepscope.integrations.lightning import StepscopeCallback

    class LM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = gpt2()

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    stamps: list[float] = []

    class Timer(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stamps.append(time.perf_counter())

    callbacks: list = []
    logger: object = False
    if kind == "stepscope":
        callbacks.append(StepscopeCallback())
    elif kind == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        logger = WandbLogger(project="stepscope-bench", save_dir=root, offline=True)
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        callbacks=[*callbacks, Timer()],
        default_root_dir=root,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    loader = torch.utils.data.DataLoader(Tokens(8 * steps), batch_size=8)
    trainer.fit(LM(), loader)
    if kind == "wandb":
        import wandb

        wandb.finish()
    if kind == "stepscope":
        TELEMETRY["lightning"].append(telemetry_fraction(os.path.join(root, "stepscope")))
    return [b - a for a, b in itertools.pairwise(stamps)][WARMUP:]


# ---------------------------------------------------------------------- Hugging Face
def hf_arm(kind: str, steps: int, root: str) -> list[float]:
    import transformers

    from stepscope.integrations.transformers import StepscopeCallback

    stamps: list[float] = []

    class Timer(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    args = transformers.TrainingArguments(
        output_dir=root,
        max_steps=steps,
        per_device_train_batch_size=8,
        report_to=["tensorboard"] if kind == "tensorboard" else [],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=1e-4,
    )
    callbacks = [StepscopeCallback()] if kind == "stepscope" else []
    trainer = transformers.Trainer(
        model=gpt2(), args=args, train_dataset=Tokens(8 * steps), callbacks=[*callbacks, Timer()]
    )
    trainer.train()
    if kind == "stepscope":
        TELEMETRY["transformers"].append(telemetry_fraction(os.path.join(root, "stepscope")))
    return [b - a for a, b in itertools.pairwise(stamps)][WARMUP:]


def compare(
    title: str, arms: dict[str, Callable[[str], list[float]]], rounds: int
) -> dict[str, float]:
    """Per round: each arm's mean step time / the control's in that round; median over rounds."""
    names = list(arms)
    with tempfile.TemporaryDirectory() as root:
        arms[names[0]](root)  # warm-up fit, discarded: first-call costs land on no arm
    means: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate the order
            with tempfile.TemporaryDirectory() as root:
                means[name].append(statistics.fmean(arms[name](root)))
    control = names[0]
    ratios = {k: [m / c for m, c in zip(v, means[control])] for k, v in means.items()}
    mean0 = statistics.median(means[control])
    print(f"\n{title}: control {mean0 * 1e3:.1f} ms/step (median of round means)")
    print("| arm | step / control (median over rounds) | per-round ratios |\n|---|---:|---|")
    out = {}
    for name, rs in ratios.items():
        out[name] = statistics.median(rs)
        print(f"| {name} | {out[name]:.3f} | {', '.join(f'{x:.2f}' for x in rs)} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    a = parser.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    print("command:", " ".join([os.path.basename(sys.executable), *sys.argv]))
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    compare(
        "Lightning",
        {
            "no logger (control)": lambda r: lightning_arm("control", a.steps, r),
            "StepscopeCallback(), default cadence": lambda r: lightning_arm(
                "stepscope", a.steps, r
            ),
            "WandbLogger(offline=True)": lambda r: lightning_arm("wandb", a.steps, r),
        },
        a.rounds,
    )
    compare(
        "Hugging Face Trainer",
        {
            "report_to=[] (control)": lambda r: hf_arm("control", a.steps, r),
            "StepscopeCallback(), default cadence": lambda r: hf_arm("stepscope", a.steps, r),
            'report_to="tensorboard"': lambda r: hf_arm("tensorboard", a.steps, r),
        },
        a.rounds,
    )
    print("\nstepscope's own clocks (telemetry / training seconds, median over fits; load-immune):")
    for fw, fractions in TELEMETRY.items():
        print(
            f"  {fw}: {statistics.median(fractions):.3f} ({', '.join(f'{f:.3f}' for f in fractions)})"
        )


if __name__ == "__main__":
    main()

"""The demo job: train the reference MLP on bundled digits and show what stepscope sees.

Example
-------
>>> from stepscope.demo.run import DemoConfig, run_demo
>>> result = run_demo(DemoConfig(quick=True, out_dir="runs/demo"))  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import torch
import torch.nn.functional as F

from stepscope.collect import ALL_STREAMS, HistoryCollector, WatchSettings
from stepscope.demo.data import DigitSplits, load_digits_splits
from stepscope.demo.model import ciresan_mlp
from stepscope.errors import Refusal
from stepscope.stats import aggregate, render_histogram, render_spine


@dataclass(frozen=True)
class DemoConfig:
    """What the demo trains and where it writes.

    ``quick`` shrinks everything for tests (a few seconds on a laptop CPU).
    """

    out_dir: str = "runs/demo"
    seed: int = 0
    epochs: int = 3
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    width_scale: float = 0.1
    final_relu: bool = False
    data_source: str = "auto"
    quick: bool = False
    threads: int = 0

    def effective(self) -> DemoConfig:
        if not self.quick:
            return self
        return DemoConfig(**{**asdict(self), "epochs": min(self.epochs, 1), "width_scale": 0.02})


@dataclass
class DemoResult:
    """What the demo produced: metrics per epoch and the dataset-mode statistics."""

    config: DemoConfig
    data: dict[str, object]
    epochs: list[dict[str, float]] = field(default_factory=list)
    activation_stats: dict[str, dict[str, object]] = field(default_factory=dict)
    out_dir: Path | None = None
    artifact: Path | None = None
    telemetry_seconds: float = 0.0
    training_seconds: float = 0.0


class _Progress:
    """A dependency-free progress bar on stderr."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total, self.label, self.stream, self.done = total, label, stream or sys.stderr, 0
        self.start = time.perf_counter()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if (
            self.done < self.total
            and not self.stream.isatty()
            and self.done % max(1, self.total // 4)
        ):
            return  # in logs, print a few lines rather than one per step
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac)
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        self.stream.write(
            f"\r{self.label} [{bar:<30}] {self.done}/{self.total} {rate:.0f}/s {note}"
        )
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Mean cross-entropy and accuracy in eval mode (modes restored)."""
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(x)
        out = {
            "loss": float(F.cross_entropy(logits, y)),
            "accuracy": float((logits.argmax(1) == y).float().mean()),
        }
    model.train(was)
    return out


def run_demo(config: DemoConfig, stream: TextIO | None = None) -> DemoResult:
    """Train with the collector on, evaluate, and print what stepscope saw.

    ``stream`` defaults to the *current* ``sys.stdout`` (looked up at call time).
    """
    stream = stream or sys.stdout
    cfg = config.effective()
    if cfg.epochs < 1 or cfg.batch_size < 1 or cfg.lr <= 0:
        raise Refusal("run_config_invalid", f"epochs, batch_size and lr must be positive: {cfg}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    splits: DigitSplits = load_digits_splits(cfg.data_source)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = ciresan_mlp(
        n_inputs=splits.n_features, width_scale=cfg.width_scale, final_relu=cfg.final_relu
    )
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    result = DemoResult(config=cfg, data=splits.describe(), out_dir=out_dir)
    n = len(splits.train_y)
    steps_per_epoch = (n + cfg.batch_size - 1) // cfg.batch_size
    print(
        f"data: {splits.source}, {n} train / {len(splits.val_y)} val / {len(splits.test_y)} test "
        f"(split {splits.split_hash[:12]})",
        file=stream,
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    artifact = out_dir / f"seed{cfg.seed}"
    if artifact.exists():
        import shutil

        shutil.rmtree(artifact)  # the demo owns its output directory; a rerun starts fresh
    collector = HistoryCollector(
        model,
        sites="*",
        streams=ALL_STREAMS,
        settings=WatchSettings(
            output_dir=str(artifact),
            run_id=f"demo-seed{cfg.seed}",
            extra={"data": splits.describe()},
        ),
    )
    result.artifact = artifact
    t_start = time.perf_counter()
    try:
        _train(cfg, model, opt, splits, collector, gen, steps_per_epoch, result, stream)
    finally:
        collector.close()
    result.training_seconds = time.perf_counter() - t_start - collector.telemetry_seconds
    result.telemetry_seconds = collector.telemetry_seconds
    print(
        f"telemetry: {collector.telemetry_seconds:.2f} s of {time.perf_counter() - t_start:.2f} s "
        f"({100 * collector.telemetry_seconds / max(result.training_seconds, 1e-9):.1f}% of training time); "
        f"artifact: {artifact}",
        file=stream,
    )
    _summarise(model, splits, result, stream)
    return result


def _train(cfg, model, opt, splits, collector, gen, steps_per_epoch, result, stream) -> None:
    n = len(splits.train_y)
    for epoch in range(cfg.epochs):
        order = torch.randperm(n, generator=gen)
        bar = _Progress(steps_per_epoch, f"epoch {epoch + 1}/{cfg.epochs}")
        model.train()
        for i in range(steps_per_epoch):
            idx = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            with collector.step(opt, examples=len(idx), epoch=epoch) as st:
                loss = F.cross_entropy(model(splits.train_x[idx]), splits.train_y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                st.log("train/loss", loss)
                st.log("train/lr", opt.param_groups[0]["lr"])
            bar.advance(note=f"loss {loss.item():.3f}")
        metrics = {
            "epoch": epoch + 1,
            **{f"val_{k}": v for k, v in evaluate(model, splits.val_x, splits.val_y).items()},
        }
        result.epochs.append(metrics)
        print(
            f"epoch {epoch + 1}: validation loss {metrics['val_loss']:.4f}, accuracy {metrics['val_accuracy']:.3f}",
            file=stream,
        )


def _summarise(model, splits, result, stream) -> None:
    batches = [splits.val_x[i : i + 256] for i in range(0, len(splits.val_y), 256)]
    stats = aggregate(model, batches, sites="ReLU", stats=("spine", "histogram"))
    print(
        "\nactivation spines over the validation set (dataset mode, stepscope.stats.aggregate):",
        file=stream,
    )
    for name, s in stats.items():
        print(f"  layer {name:>3}: {render_spine(s['spine'])}", file=stream)
        result.activation_stats[name] = {k: v.to_dict() for k, v in s.items()}
    last = list(stats)[-1]
    print(
        f"\nsigned log2 histogram of layer {last} (4 bins per octave, exact counts):", file=stream
    )
    print(render_histogram(stats[last]["histogram"], max_rows=20), file=stream)

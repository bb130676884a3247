"""Pieces of the demo job: a progress bar, evaluation, and dataset-mode statistics printing."""

from __future__ import annotations

from typing import TextIO, TypeVar

import torch
import torch.nn.functional as F

from stepscope.demo.data import DigitSplits
from stepscope.stats import (
    Histogram,
    RunningStats,
    StreamingStat,
    aggregate,
    render_histogram,
    render_spine,
)

S = TypeVar("S", RunningStats, Histogram)


def evaluate(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, confusion: bool = False
) -> dict:
    """Mean cross-entropy and accuracy in eval mode (modes restored).

    With ``confusion``, also ``"confusion"``: the ``(classes, classes)`` count matrix
    ``[true][predicted]`` (``log_eval`` stores it cell by cell).
    """
    was = model.training
    model.eval()
    with torch.no_grad():
        logits = model(x)
        out: dict = {
            "loss": float(F.cross_entropy(logits, y)),
            "accuracy": float((logits.argmax(1) == y).float().mean()),
        }
        if confusion:
            c = logits.shape[1]
            cells = torch.bincount(y * c + logits.argmax(1), minlength=c * c)
            out["confusion"] = cells.reshape(c, c).cpu()
    model.train(was)
    return out


def print_dataset_statistics(model: torch.nn.Module, splits: DigitSplits, stream: TextIO) -> dict:
    """Dataset-mode spines of every ReLU over the validation set, and one text histogram."""
    batches = [splits.val_x[i : i + 256] for i in range(0, len(splits.val_y), 256)]
    stats = aggregate(model, batches, sites="ReLU", stats=("spine", "histogram"))
    print(
        "activation spines over the validation set (dataset mode, stepscope.stats.aggregate):",
        file=stream,
    )
    for name, s in stats.items():
        print(f"  layer {name:>3}: {render_spine(_as(RunningStats, s['spine']))}", file=stream)
    last = list(stats)[-1]
    print(
        f"\nsigned log2 histogram of layer {last} (4 bins per octave, exact counts):", file=stream
    )
    hist = _as(Histogram, stats[last]["histogram"])
    print(render_histogram(hist, max_rows=20), file=stream)
    return stats


def _as(kind: type[S], stat: StreamingStat) -> S:
    """``stat`` as the built-in statistic ``aggregate`` makes for its name (a bug otherwise)."""
    if not isinstance(stat, kind):
        raise TypeError(f"expected {kind.__name__}, aggregate returned {type(stat).__name__}")
    return stat

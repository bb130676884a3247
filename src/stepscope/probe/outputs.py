"""Selecting logits from a model's output and aligning them with class or token targets.

Shared by the dense probe, :func:`stepscope.analyze_curvature` and the Hessian probes, so the
three read a dict / HF ``ModelOutput`` and a language-model loss the same way.

- ``output``: ``None`` (the model returns the logit tensor), a key (``"logits"``: works for dicts
  and HF ``ModelOutput``) or a callable ``output -> logits``.
- Targets: ``(n,)`` class labels with ``(n, C)`` logits (one target per example), or ``(n, T)``
  token labels with ``(n, T, C)`` logits (one example = one sequence; its loss is the *sum* over
  its scored positions). Positions whose label is ``ignore_index`` (default -100, the HF and
  ``F.cross_entropy`` convention) are not scored. ``next_token=True`` applies the causal-LM shift
  (logits at ``t`` predict the label at ``t + 1``, as HF ``GPT2LMHeadModel`` does when given
  ``labels=input_ids``).

Example
-------
>>> import torch
>>> t = score_targets(torch.zeros(2, 4, 5), torch.tensor([[1, 2, 3, -100], [0, 0, 1, 1]]),
...                   next_token=True)
>>> tuple(t.logits.shape), t.owner.tolist(), t.per_example_counts.tolist()
((5, 5), [0, 0, 1, 1, 1], [2, 3])
>>> select_logits({"logits": torch.ones(2, 3)}, "logits").shape
torch.Size([2, 3])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stepscope.errors import Refusal

#: ``output=``: ``None`` (a tensor), a key of a dict / ``ModelOutput``, or ``output -> logits``.
OutputSelector = str | Callable[[Any], Tensor] | None
#: Labels equal to this are not scored (``F.cross_entropy`` / HF convention).
IGNORE_INDEX = -100


def select_logits(out: Any, output: OutputSelector, code: str = "probe_output_invalid") -> Tensor:
    """The logit tensor selected from a model's return value.

    Raises
    ------
    Refusal
        ``code`` when the selector does not yield a tensor (the message lists the output's keys).
    """
    value = out
    if callable(output):
        value = output(out)
    elif output is not None:
        try:
            value = out[output]
        except (KeyError, TypeError, IndexError):
            value = None
    if isinstance(value, Tensor):
        return value
    keys = list(out.keys()) if isinstance(out, Mapping) or hasattr(out, "keys") else None
    what = f"keys {keys}" if keys is not None else type(out).__name__
    raise Refusal(
        code,
        f"output={output!r} does not select a logit tensor from the model's output ({what})",
        ["pass output='logits' (a dict / ModelOutput key) or a callable returning the logits"],
    )


@dataclass(frozen=True)
class ScoredTargets:
    """The scored ``(logit row, label)`` pairs of a probe batch, and which example owns each.

    Attributes
    ----------
    logits
        ``(m, C)``: one row per scored target (a view/selection of the model's logits).
    labels
        ``(m,)`` int64 class ids.
    owner
        ``(m,)`` example index of each row (sorted).
    n
        Number of examples.
    sequence
        ``True`` for token targets (``(n, T)`` labels).
    positions
        Logit positions per example (1 for class targets; ``T`` or ``T - 1`` with ``next_token``).
    keep
        ``(n, positions)`` bool mask of scored positions (``None`` for class targets).
    """

    logits: Tensor
    labels: Tensor
    owner: Tensor
    n: int
    sequence: bool
    positions: int
    keep: Tensor | None

    @property
    def per_example_counts(self) -> Tensor:
        """Scored targets per example, ``(n,)``."""
        return torch.bincount(self.owner, minlength=self.n)


def score_targets(
    logits: Tensor,
    labels: Tensor,
    *,
    next_token: bool = False,
    ignore_index: int = IGNORE_INDEX,
    code: str = "probe_output_invalid",
    label_code: str | None = None,
) -> ScoredTargets:
    """Align ``(n, C)`` / ``(n, T, C)`` logits with ``(n,)`` / ``(n, T)`` labels.

    Raises
    ------
    Refusal
        ``code`` for shapes that do not align or non-floating logits; ``label_code`` (default
        ``code``) for labels outside ``[0, C)``.
    """
    n = labels.shape[0] if labels.dim() else 0
    ok = logits.is_floating_point() and logits.dim() >= 2 and logits.shape[0] == n
    if ok and labels.dim() == 1 and logits.dim() == 2 and not next_token:
        rows, lab, keep, positions = logits, labels, None, 1
        owner = torch.arange(n, device=labels.device)
    elif ok and labels.dim() == 2 and logits.dim() == 3 and logits.shape[1] == labels.shape[1]:
        seq, lab2 = (logits[:, :-1], labels[:, 1:]) if next_token else (logits, labels)
        keep = lab2 != ignore_index
        positions = int(seq.shape[1])
        rows, lab = seq[keep], lab2[keep]
        owner = keep.nonzero()[:, 0]
    else:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise Refusal(
            code,
            f"logits {shape} do not align with labels {tuple(labels.shape)}: expected (n, C) "
            "logits with (n,) labels, or (n, T, C) logits with (n, T) token labels",
            ["select the logits with output='logits'", "check the label shape"],
        )
    classes = int(logits.shape[-1])
    if lab.numel() and (int(lab.min()) < 0 or int(lab.max()) >= classes):
        raise Refusal(
            label_code or code,
            f"labels fall outside [0, {classes}) (ignore_index={ignore_index} excepted)",
            ["check the label range", "mark unscored positions with ignore_index"],
        )
    return ScoredTargets(rows, lab.long(), owner, n, labels.dim() == 2, positions, keep)


__all__ = ["IGNORE_INDEX", "OutputSelector", "ScoredTargets", "score_targets", "select_logits"]

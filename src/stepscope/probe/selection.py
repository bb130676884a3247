"""Choosing the fixed dense probe: indices drawn once from the fitting split, then hashed.

The probe is a small fixed subset of the *fitting* training split (the tensors you pass are that
split). Its indices come either from a private ``torch.Generator`` seeded with ``seed`` (the global
RNG is never read or advanced) or from explicit ``indices``. The selected inputs and labels are
hashed with sha256 over their raw bytes so that every measurement names exactly which examples it
saw.

Example
-------
>>> import torch
>>> x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10) % 3
>>> sel, px, py = select_probe(x, y, size=4, seed=7)
>>> sel.size, len(sel.sha256), tuple(px.shape)
(4, 64, (4, 2))
>>> select_probe(x, y, indices=[3, 0])[0].indices
(0, 3)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal


@dataclass(frozen=True)
class ProbeSelection:
    """Which examples form the probe, and how they were chosen.

    Attributes
    ----------
    indices
        Positions inside the fitting split, ascending, unique.
    split_size
        Number of examples in the fitting split the indices refer to.
    method
        ``"seeded_randperm"`` (private ``torch.Generator``) or ``"explicit_indices"``.
    seed
        The private generator's seed, ``None`` for explicit indices.
    sha256
        sha256 hex digest of the selected inputs' raw bytes followed by the labels' raw bytes
        (C-contiguous, native byte order, ascending index order; labels as int64).
    input_dtype, input_shape, label_dtype
        What was hashed.
    input_normalization
        The user's description of how inputs were normalised (recorded, never applied).
    input_min, input_max, input_mean
        The probe inputs' range and mean, so an un-normalised 0..255 probe is visible.
    """

    indices: tuple[int, ...]
    split_size: int
    method: str
    seed: int | None
    sha256: str
    input_dtype: str
    input_shape: tuple[int, ...]
    label_dtype: str
    input_normalization: str
    input_min: float
    input_max: float
    input_mean: float

    @property
    def size(self) -> int:
        """Number of probe examples."""
        return len(self.indices)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe description (indices included)."""
        return {
            "indices": list(self.indices),
            "size": self.size,
            "split_size": self.split_size,
            "method": self.method,
            "seed": self.seed,
            "sha256": self.sha256,
            "input_dtype": self.input_dtype,
            "input_shape": list(self.input_shape),
            "label_dtype": self.label_dtype,
            "input_normalization": self.input_normalization,
            "input_min": self.input_min,
            "input_max": self.input_max,
            "input_mean": self.input_mean,
        }


def probe_hash(inputs: torch.Tensor, labels: torch.Tensor) -> str:
    """sha256 over the raw bytes of ``inputs`` then ``labels`` (CPU, C-contiguous)."""
    digest = hashlib.sha256()
    for t in (inputs, labels):
        digest.update(np.ascontiguousarray(t.detach().cpu().numpy()).tobytes())
    return digest.hexdigest()


def _refuse(message: str, remedies: Sequence[str]) -> Refusal:
    return Refusal("probe_split_invalid", message, remedies)


def _check_split(inputs: torch.Tensor, labels: torch.Tensor) -> int:
    if not isinstance(inputs, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise _refuse("inputs and labels must be torch tensors", ["pass torch.Tensor objects"])
    if inputs.dim() < 1 or labels.dim() not in (1, 2) or inputs.shape[0] != labels.shape[0]:
        raise _refuse(
            f"inputs {tuple(inputs.shape)} and labels {tuple(labels.shape)} do not describe the "
            "same examples",
            ["pass inputs of shape (N, ...) and integer labels of shape (N,) or tokens (N, T)"],
        )
    if labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise _refuse(f"labels have dtype {labels.dtype}, not integer class ids", ["cast labels"])
    if inputs.shape[0] == 0:
        raise _refuse("the fitting split is empty", ["pass the fitting training split"])
    return int(inputs.shape[0])


def _draw(split_size: int, size: int, seed: int) -> tuple[int, ...]:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise _refuse(f"size must be a positive integer, got {size!r}", ["pass size >= 1"])
    if size > split_size:
        raise _refuse(
            f"size {size} exceeds the fitting split's {split_size} examples",
            [f"pass size <= {split_size}", "or pass explicit indices"],
        )
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(seed))
    drawn = torch.randperm(split_size, generator=generator)[:size]
    return tuple(sorted(int(i) for i in drawn.tolist()))


def _validate(
    indices: Sequence[int] | torch.Tensor | np.ndarray, split_size: int
) -> tuple[int, ...]:
    arr = np.asarray(indices.cpu() if isinstance(indices, torch.Tensor) else indices)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise _refuse(
            "indices must be a non-empty 1-D sequence of integers",
            ["pass e.g. indices=range(128)"],
        )
    bad = arr[(arr < 0) | (arr >= split_size)]
    if bad.size:
        raise _refuse(
            f"{bad.size} indices lie outside the fitting split [0, {split_size}) (first: {bad[0]})",
            ["draw probe indices from the fitting training split only"],
        )
    if np.unique(arr).size != arr.size:
        raise _refuse("indices contain duplicates", ["pass each example at most once"])
    return tuple(sorted(int(i) for i in arr.tolist()))


def select_probe(
    inputs: torch.Tensor,
    labels: torch.Tensor,
    size: int = 128,
    seed: int = DEFAULT_SEED,
    indices: Sequence[int] | torch.Tensor | np.ndarray | None = None,
    input_normalization: str = "none recorded (inputs used as given)",
) -> tuple[ProbeSelection, torch.Tensor, torch.Tensor]:
    """Select and hash the probe.

    Parameters
    ----------
    inputs, labels
        The fitting training split: ``(N, ...)`` inputs and ``(N,)`` integer labels.
    size
        Number of examples drawn when ``indices`` is ``None`` (ignored otherwise).
    seed
        Seed of the private generator; the global RNG is untouched.
    indices
        Explicit positions inside the split (validated: integer, unique, in ``[0, N)``).
    input_normalization
        A description of how ``inputs`` were normalised, recorded with the probe.

    Returns
    -------
    selection, probe_inputs, probe_labels
        The record and detached CPU copies of the selected examples (index order).

    Raises
    ------
    Refusal
        ``probe_split_invalid`` for indices outside the split, duplicates, a size larger than the
        split, or inputs/labels that do not describe the same examples.
    """
    split_size = _check_split(inputs, labels)
    if indices is None:
        chosen, method, used_seed = _draw(split_size, size, seed), "seeded_randperm", int(seed)
    else:
        chosen, method, used_seed = _validate(indices, split_size), "explicit_indices", None
    index = torch.tensor(chosen, dtype=torch.int64)
    x = inputs.detach().cpu().index_select(0, index).contiguous()
    y = labels.detach().cpu().index_select(0, index).to(torch.int64).contiguous()
    xf = x.to(torch.float64)
    selection = ProbeSelection(
        indices=chosen,
        split_size=split_size,
        method=method,
        seed=used_seed,
        sha256=probe_hash(x, y),
        input_dtype=str(x.dtype).replace("torch.", ""),
        input_shape=tuple(x.shape),
        label_dtype="int64",
        input_normalization=input_normalization,
        input_min=float(xf.min()),
        input_max=float(xf.max()),
        input_mean=float(xf.mean()),
    )
    return selection, x, y

"""Update sampling: the actual change an optimizer step made to a seeded parameter subvector.

Before the step, each ``update`` row's parameter is sampled at fixed indices (or whole, when it
has at most ``sample_size`` elements; see :func:`~stepscope.collect.sites.update_indices`); after
the step the same indices are sampled again and the difference is reduced.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from stepscope.collect.sites import Row, update_indices


def assign_update_indices(rows: Sequence[Row], sample_size: int, seed: int) -> None:
    """Fix every ``update`` row's sampled indices (``None``: the whole parameter)."""
    for r in rows:
        if r.stream == "update" and r.param is not None:
            r.update_index = update_indices(
                r.site, r.param.numel(), sample_size, seed, r.param.device
            )


def sample(row: Row) -> torch.Tensor:
    """A float32 copy of the row's parameter at its update indices."""
    if row.param is None:  # a retired row (its parameter was removed) is never sampled
        raise ValueError(f"update row {row.site!r} has no parameter")
    flat = row.param.detach().reshape(-1)
    picked = flat if row.update_index is None else flat.index_select(0, row.update_index)
    return picked.to(torch.float32, copy=True)


class UpdateSampler:
    """Holds the pre-step samples until the post-step hook takes the difference."""

    def __init__(self) -> None:
        self._before: dict[int, torch.Tensor] = {}

    def snapshot(self, rows: Sequence[Row]) -> None:
        """Sample every row before the optimizer changes it."""
        with torch.no_grad():
            for row in rows:
                self._before[row.index] = sample(row)

    def deltas(self, rows: Sequence[Row]) -> Iterator[tuple[Row, torch.Tensor]]:
        """``(row, after - before)`` for every row snapshotted since the last call."""
        with torch.no_grad():
            for row in rows:
                before = self._before.pop(row.index, None)
                if before is not None:
                    yield row, sample(row) - before

    def clear(self) -> None:
        """Forget pending samples (the step was abandoned)."""
        self._before.clear()

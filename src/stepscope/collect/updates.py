"""Update sampling: the actual change an optimizer step made to a seeded parameter subvector.

Before the step, each ``update`` row's parameter is sampled at fixed indices (or whole, when it
has at most ``sample_size`` elements; see :func:`~stepscope.collect.sites.update_indices`); after
the step the same indices are sampled again and the difference is reduced. The indices are
logical: a sharded (DTensor) parameter samples the ones its local shard owns
(:func:`~stepscope.collect.sharded.local_sample_index`), so the merged sample does not depend on
the world size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from stepscope.collect.sharded import is_sharded, local_part, local_sample_index
from stepscope.collect.sites import Row, update_indices


def assign_update_indices(rows: Sequence[Row], sample_size: int, seed: int) -> None:
    """Fix every ``update`` row's sampled indices (``None``: the whole parameter)."""
    for r in rows:
        if r.stream == "update" and r.param is not None:
            r.update_index = update_indices(
                r.site, r.param.numel(), sample_size, seed, r.param.device
            )


def sample(row: Row, index: torch.Tensor | None) -> torch.Tensor:
    """A copy of the row's parameter (its local shard, for a DTensor) at flat ``index``.

    float64 parameters stay float64 (a float32 copy would round ``after - before`` away);
    every other dtype is copied to float32.
    """
    if row.param is None:  # a retired row (its parameter was removed) is never sampled
        raise ValueError(f"update row {row.site!r} has no parameter")
    local, _ = local_part(row.param.detach())
    if local is None:
        raise ValueError(f"update row {row.site!r}: {_}")
    flat = local.reshape(-1)
    dtype = torch.float64 if flat.dtype == torch.float64 else torch.float32
    if index is None:
        return flat.to(dtype, copy=True)
    return flat.index_select(0, index).to(dtype)  # index_select already copies


class UpdateSampler:
    """Holds the pre-step samples until the post-step hook takes the difference."""

    def __init__(self) -> None:
        self._before: dict[int, torch.Tensor] = {}
        # row -> (the parameter and logical sample it was computed for, its local indices)
        self._local: dict[int, tuple[int, int, torch.Tensor | None]] = {}

    def _index(self, row: Row) -> torch.Tensor | None:
        """The row's sample in its parameter's local storage (logical indices it owns)."""
        if row.param is None or not is_sharded(row.param):
            return row.update_index
        key = (id(row.param), id(row.update_index))  # model surgery replaces both
        cached = self._local.get(row.index)
        if cached is None or cached[:2] != key:
            cached = (*key, local_sample_index(row.param, row.update_index))
            self._local[row.index] = cached
        return cached[2]

    def snapshot(self, rows: Sequence[Row]) -> None:
        """Sample every row before the optimizer changes it."""
        with torch.no_grad():
            for row in rows:
                self._before[row.index] = sample(row, self._index(row))

    def deltas(self, rows: Sequence[Row]) -> Iterator[tuple[Row, torch.Tensor]]:
        """``(row, after - before)`` for every row snapshotted since the last call."""
        with torch.no_grad():
            for row in rows:
                before = self._before.pop(row.index, None)
                if before is not None:  # the fresh after-sample becomes the difference
                    yield row, sample(row, self._index(row)).sub_(before)

    def clear(self) -> None:
        """Forget pending samples (the step was abandoned)."""
        self._before.clear()

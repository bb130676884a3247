"""Update sampling: the actual change an optimizer step made to a seeded parameter subvector.

Before the step, each ``update`` row's parameter is sampled at fixed indices (or whole, when it
has at most ``sample_size`` elements; see :func:`~stepscope.collect.sites.update_indices`); after
the step the same indices are sampled again and the difference is reduced. The indices are
logical: a sharded (DTensor) parameter samples the ones its local shard owns
(:func:`~stepscope.collect.distributed.local_sample_index`), so the merged sample does not depend on
the world size.

The common case takes one native call per step and direction (:class:`UpdateSampler`): the
rows whose parameter is a plain, contiguous CPU float32/float64 tensor are sampled together by a
:class:`~stepscope.stats.gather.SampleGather` into preallocated buffers (re-planned when the rows,
their parameters or their indices change), and the difference is taken in place. Every other row
(bf16/fp16 parameters, CUDA, ``DTensor``, non-contiguous, no native library, ``kernel_backend=
"torch"``) is sampled one by one by :func:`sample`, as before; both give the same numbers bit for
bit.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Iterator, MutableMapping, Sequence

import torch

from stepscope.collect.distributed import is_sharded, local_part, local_sample_index
from stepscope.collect.sites import SiteRow, update_indices
from stepscope.stats import _native
from stepscope.stats.gather import SampleGather, gatherable

#: At most this many gather plans are kept (one per optimizer's row list).
MAX_PLANS = 4


def assign_update_indices(rows: Sequence[SiteRow], sample_size: int, seed: int) -> None:
    """Fix every ``update`` row's sampled indices (``None``: the whole parameter)."""
    for r in rows:
        if r.stream == "update" and r.param is not None:
            r.update_index = update_indices(
                r.site, r.param.numel(), sample_size, seed, r.param.device
            )


def sample(row: SiteRow, index: torch.Tensor | None) -> torch.Tensor:
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


def stepped_only(
    deltas: Iterable[tuple[SiteRow, torch.Tensor]], notes: MutableMapping[int, str], note: str
) -> list[tuple[SiteRow, torch.Tensor]]:
    """The deltas of parameters the optimizer stepped. Torch optimizers skip a parameter whose
    ``.grad`` is ``None`` (it stays so after the step): its row is left out, ``notes[row]`` set
    to ``note`` (recorded ``site_absent`` with that disclosure, never an observed zero)."""
    kept = []
    for row, delta in deltas:
        if row.param is not None and row.param.grad is None:
            notes[row.index] = note
        else:
            kept.append((row, delta))
    return kept


class _Plan:
    """The native half of one row list: which rows it gathers, for which parameters."""

    def __init__(self, rows: Sequence[SiteRow], lib: ctypes.CDLL) -> None:
        self.rows = rows  # held: the plan is keyed on id(rows)
        self.native = [
            r for r in rows if r.param is not None and gatherable(r.param) and _flat(r.update_index)
        ]
        native = {r.index for r in self.native}
        self.fallback = [r for r in rows if r.index not in native]
        self.params: list[torch.Tensor] = [r.param for r in self.native if r.param is not None]
        self.indices = [r.update_index for r in self.native]
        self.gather = SampleGather(self.params, self.indices, lib)
        self.pairs = list(zip(self.native, self.gather.samples))  # (row, its delta), row order
        self.deltas = {r.index: s for r, s in self.pairs}
        self.pending = False  # the buffers hold pre-step samples not yet differenced

    def bind(self) -> bool:
        """Whether every row still holds the plan's parameter and indices (then bound)."""
        for r, p, idx in zip(self.native, self.params, self.indices):
            if r.param is not p or r.update_index is not idx:
                return False
        return self.gather.bind(self.params)


def _flat(index: torch.Tensor | None) -> bool:
    return index is None or (index.is_cpu and index.dim() == 1 and not index.is_floating_point())


class UpdateSampler:
    """Holds the pre-step samples until the post-step hook takes the difference.

    Parameters
    ----------
    backend
        The collector's kernel backend; ``"torch"`` (and ``"triton"``) sample every row one by
        one.
    """

    def __init__(self, backend: str = "auto") -> None:
        #: whether eligible rows are gathered in one native call (tests and benchmarks switch it)
        self.native = backend in ("auto", "c")
        self._plans: dict[int, _Plan] = {}  # id(rows) -> plan
        self._before: dict[int, torch.Tensor] = {}
        # row -> (the parameter and logical sample it was computed for, its local indices)
        self._local: dict[int, tuple[int, int, torch.Tensor | None]] = {}

    def _index(self, row: SiteRow) -> torch.Tensor | None:
        """The row's sample in its parameter's local storage (logical indices it owns)."""
        if row.param is None or not is_sharded(row.param):
            return row.update_index
        key = (id(row.param), id(row.update_index))  # model surgery replaces both
        cached = self._local.get(row.index)
        if cached is None or cached[:2] != key:
            cached = (*key, local_sample_index(row.param, row.update_index))
            self._local[row.index] = cached
        return cached[2]

    def _plan(self, rows: Sequence[SiteRow]) -> _Plan | None:
        """The bound gather plan of ``rows`` (``None``: sample every row one by one)."""
        if not self.native or not rows:
            return None
        lib = _native.loaded()
        if lib is None:
            return None
        plan = self._plans.get(id(rows))
        if plan is None or plan.rows is not rows or not plan.bind():
            plan = _Plan(rows, lib)  # bound to the parameters it was built from
            self._forget_superseded(rows)
            self._plans[id(rows)] = plan
        return plan if plan.native else None  # e.g. a CUDA or bf16 model: nothing to gather

    def _forget_superseded(self, rows: Sequence[SiteRow]) -> None:
        """Drop the plans a new one for ``rows`` replaces (they hold parameters and storage).

        A plan of this list, or of a list sharing a row with it (the same optimizer's rows
        before model surgery or ``add_param_group``), is superseded; of the others (other
        optimizers), the oldest idle ones go beyond :data:`MAX_PLANS`.
        """
        members = {id(r) for r in rows}
        for key, old in list(self._plans.items()):
            if key == id(rows) or any(id(r) in members for r in old.rows):
                self._drop(key)
        idle = [key for key, p in self._plans.items() if not p.pending]  # oldest first
        for key in idle[: max(0, len(self._plans) - MAX_PLANS + 1)]:
            del self._plans[key]

    def _drop(self, key: int) -> None:
        """Forget a plan; pre-step samples it still holds become per-row ones."""
        plan = self._plans.pop(key)
        if plan.pending:
            for row, pre_step in plan.pairs:
                self._before[row.index] = pre_step.clone()

    def snapshot(self, rows: Sequence[SiteRow]) -> None:
        """Sample every row before the optimizer changes it."""
        with torch.no_grad():
            plan = self._plan(rows)
            if plan is not None:
                plan.gather.gather(subtract=False)
                plan.pending = True
                if self._before:  # an older per-row sample of a row the plan now takes
                    for row in plan.native:
                        self._before.pop(row.index, None)
            for row in rows if plan is None else plan.fallback:
                self._before[row.index] = sample(row, self._index(row))

    def deltas(self, rows: Sequence[SiteRow]) -> Iterator[tuple[SiteRow, torch.Tensor]]:
        """``(row, after - before)`` for every row snapshotted since the last call.

        A natively gathered difference is a view into the plan's buffer, valid until the next
        :meth:`snapshot` of these rows: reduce it before then (the collector reduces at once).
        """
        with torch.no_grad():
            native: dict[int, torch.Tensor] = {}
            plan = self._plans.get(id(rows))
            if plan is not None and plan.pending:
                plan.pending = False
                if plan.rows is rows and plan.bind():
                    plan.gather.gather(subtract=True)
                    if not plan.fallback:  # every row gathered (the common case)
                        yield from plan.pairs
                        return
                    native = plan.deltas
                else:  # a parameter changed under the step: its pre-step sample goes per row
                    plan.pending = True
                    self._drop(id(rows))
            for row in rows:
                delta = native.get(row.index)
                if delta is not None:
                    yield row, delta
                    continue
                before = self._before.pop(row.index, None)
                if before is not None:  # the fresh after-sample becomes the difference
                    yield row, sample(row, self._index(row)).sub_(before)

    def clear(self) -> None:
        """Forget pending samples (the step was abandoned)."""
        self._before.clear()
        for plan in self._plans.values():
            plan.pending = False

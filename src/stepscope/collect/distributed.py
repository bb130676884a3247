"""Distributed training: sharded (DTensor/FSDP2) parameters and the live rank merge.

Sharded tensors (FSDP2 / DTensor): reduce the local shard, count every logical element once.

A ``DTensor`` parameter (``torch.distributed.fsdp.fully_shard`` makes every parameter one) is a
logical tensor whose elements live on several ranks. Each rank reduces **its local shard**
(:func:`local_part`), so the rank segments merged by ``stepscope merge`` (or live, see
:mod:`stepscope.collect.distributed`) hold the statistics of the full logical parameter: counts
add exactly, ``min``/``max`` merge exactly and ``mean``/``m2`` by Chan's formulas.

Placements
----------
* ``Shard(d)``: the local shard is reduced as it is (an uneven or empty shard is fine).
* ``Replicate()``: the same values live on every rank of that mesh dimension; only the rank
  with coordinate 0 along it reduces them, the others reduce an empty slice (counts 0, no
  moments), so a merge counts each logical element once.
* ``Partial()``: the local tensor is an unreduced summand, not a value:
  ``unsupported:dtensor_partial``.
* Any other tensor subclass (fake tensors, ...) stays ``unsupported:tensor_subclass:<type>``.

The update sample is drawn over the **logical** parameter's flat indices
(:func:`~stepscope.collect.sites.update_indices` on the logical ``numel``); a shard samples the
indices it owns (:func:`local_sample_index`), so the merged sample is the same whatever the
world size.

Example
-------
>>> import torch
>>> local_part(torch.ones(3))[0].shape, is_sharded(torch.ones(3))
(torch.Size([3]), False)
>>> owned_flat_indices(torch.tensor([0, 5, 7, 11]), (4, 3), (1, 0), (2, 3)).tolist()
[[1, 2], [2, 4]]

The live rank merge: one collective per logged step, rank 0 publishes the merged rows.

Under an initialised ``torch.distributed`` process group of more than one rank, at every step
that writes rows, each rank packs its step into **one fixed-width float64 vector** (a header,
then for every row key of the collector its presence code and its spine row, and on histogram
steps a histogram flag and the histogram row) and the ranks meet in **one** ``dist.gather`` to
rank 0 - one collective per step whatever the number of sites. Rank 0 unpacks every rank's
batches and merges them with :func:`stepscope.history.merge_step_batches`, the function
``stepscope merge`` uses on the written segments, so the live merged rows equal the offline
merge of those segments (counts exact, ``min``/``max`` exact, Chan moments). Rank 0 publishes
them on its event bus instead of its own rows; the other ranks publish their own rows; the
per-rank segments stay the artifact of record.

Bytes per logged step (the plan table's ``live merge`` line, :func:`packed_width`): every rank
sends ``8 * (2 + 16 * n_rows)`` bytes, plus ``8 * n_rows * (1 + histogram width)`` on histogram
steps; rank 0 receives ``world_size`` times that. It grows with the number of row keys, never
with the number of tensor elements, and it is a single message.

What it does not carry: the per-row disclosure *texts* of ranks other than 0 (rank 0's are used
where a rank's presence equals rank 0's; they are in each rank's segment), and user scalars
(rank 0's own). It needs fixed cadences (every rank must agree which steps are logged):
``cadence="auto"`` turns it off. ``WatchSettings(live_merge=False)`` turns it off. At the first
logged step the ranks agree through the process group's store (:meth:`LiveMerge.handshake`): if
some rank has no collector (or its live merge is off) it is off everywhere, never a hang.

Example
-------
>>> packed_width(n_rows=10, histogram_width=0)  # floats per rank on a spine-only step
162
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from stepscope.collect.sites import SiteRow
from stepscope.history import ObservationBatch, StepBlockRecord
from stepscope.history.batch import code_of
from stepscope.history.merge import merge_step_batches
from stepscope.history.rankmerge import merge_step_blocks
from stepscope.history.vocab import Presence
from stepscope.stats import SPINE_WIDTH

__all__ = [
    "LiveMerge",
    "is_sharded",
    "local_part",
    "local_sample_index",
    "owned_flat_indices",
    "packed_width",
]

# ------------------------------------------------------------------ (sharded)
try:  # torch.distributed may be absent from a build
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
except ImportError:  # pragma: no cover - CPU builds without distributed
    DTensor = None  # type: ignore[assignment,misc]
    compute_local_shape_and_global_offset = None  # type: ignore[assignment]


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (its values live on several ranks)."""
    return DTensor is not None and isinstance(t, DTensor)


def _duplicate_replica(t: Any) -> bool:  # a DTensor (its class is optional at import)
    """True on a rank whose copy another rank also holds (coordinate != 0 on a Replicate dim)."""
    coords = t.device_mesh.get_coordinate()
    if coords is None:  # this rank is not in the mesh: it owns nothing
        return True
    return any(p.is_replicate() and c != 0 for p, c in zip(t.placements, coords))


def local_part(t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """``(plain tensor this rank reduces, None)`` or ``(None, unsupported reason)``.

    A plain tensor is returned as it is; a ``DTensor`` gives its local shard (an empty slice on
    a duplicate replica; see the module docstring).
    """
    if type(t) is torch.Tensor:
        return t, None
    if not is_sharded(t):
        return None, f"tensor_subclass:{type(t).__name__}"
    dt: Any = t  # a DTensor
    if any(p.is_partial() for p in dt.placements):
        return None, "dtensor_partial"
    local = dt.to_local().detach()
    if _duplicate_replica(dt):
        local = local.reshape(-1)[:0]
    return local, None


def owned_flat_indices(
    logical: torch.Tensor,
    global_shape: Sequence[int],
    global_offset: Sequence[int],
    local_shape: Sequence[int],
) -> torch.Tensor:
    """The logical flat indices a shard owns, as ``[[position in logical], [local flat index]]``.

    Parameters
    ----------
    logical
        Sorted flat indices into the logical (global) tensor (int64, 1-D).
    global_shape
        Shape of the logical tensor.
    global_offset, local_shape
        Where the shard starts in every dimension and its shape (a box of the logical tensor).

    Returns
    -------
    torch.Tensor
        ``[2, m]`` int64: row 0 the positions in ``logical`` that fall in the shard, row 1 the
        matching flat indices into the (contiguous) local shard.
    """
    strides = _row_major_strides(local_shape)
    rem = logical.clone()
    local_flat = torch.zeros_like(logical)
    inside = torch.ones_like(logical, dtype=torch.bool)
    dims = list(zip(global_shape, global_offset, local_shape, strides))
    for size, off, lsize, stride in reversed(dims):  # peel the last dimension first
        coord = rem % size
        rem = rem // size
        inside &= (coord >= off) & (coord < off + lsize)
        local_flat += (coord - off) * stride
    pos = torch.nonzero(inside).reshape(-1)
    return torch.stack([pos, local_flat[pos]])


def _row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(list(shape)):
        strides.append(acc)
        acc *= int(s)
    return list(reversed(strides))


def local_sample_index(param: Any, logical: torch.Tensor | None) -> torch.Tensor | None:
    """Flat indices into this rank's local shard of the sampled logical indices it owns.

    ``logical`` is the row's sorted logical sample (``None``: the whole parameter, which on a
    shard means the whole local shard). A plain tensor keeps ``logical`` unchanged; a duplicate
    replica owns nothing (an empty index).
    """
    if not is_sharded(param):
        return logical
    if _duplicate_replica(param):
        return torch.zeros(0, dtype=torch.int64, device=param.to_local().device)
    if logical is None:
        return None
    local_shape, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    owned = owned_flat_indices(logical.cpu(), tuple(param.shape), offset, local_shape)
    return owned[1].to(param.to_local().device)


# ------------------------------------------------------------------ (livemerge)
#: how long the first logged step waits for every rank to arrive before the live merge is off
HANDSHAKE_SECONDS = 10.0
_HEADER = 2  # examples_seen (NaN: unknown), histogram step flag
_NOT_IN_BATCH = 255.0  # presence slot of a row key no batch of this rank carries
_ABSENT = code_of(Presence.SITE_ABSENT)


def packed_width(n_rows: int, histogram_width: int) -> int:
    """Floats one rank sends per step (``histogram_width=0``: a spine-only step)."""
    hist = n_rows * (1 + histogram_width) if histogram_width else 0
    return _HEADER + n_rows * (1 + SPINE_WIDTH) + hist


def _slot_index(slots: dict[tuple[str, int], int], b: ObservationBatch) -> np.ndarray:
    """Row-key index of every row of ``b`` (-1: not a row key of this collector)."""
    keys = [(b.stream.value, int(s)) for s in b.site_ids]
    return np.array([slots.get(k, -1) for k in keys], dtype=np.int64)


class LiveMerge:
    """One gather per logged step; rank 0 gets the merged batches (see the module docstring).

    Parameters
    ----------
    rows
        The collector's row keys (fixed order, the same on every rank).
    histogram_width
        Width of a histogram row (the descriptor's).
    group
        Process group (default: the world).
    """

    _created = 0  # live merges made in this process: the n-th of every rank agree

    def __init__(
        self, rows: Sequence[SiteRow], histogram_width: int, run_id: str = "", group: Any = None
    ) -> None:
        self.rows, self.width, self.group = list(rows), histogram_width, group
        LiveMerge._created += 1
        self.key = f"stepscope/live/{run_id}/{LiveMerge._created}/"
        self.agreed: bool | None = None  # decided at the first logged step (:meth:`handshake`)
        self.rank = torch.distributed.get_rank(group)
        self.world_size = torch.distributed.get_world_size(group)
        backend = torch.distributed.get_backend(group)
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if backend == "nccl"
            else torch.device("cpu")
        )
        self.collectives = 0  # tests read this: one per logged step
        self.bytes_sent = 0
        self.seconds = 0.0  # wall time in merge() (pack, gather, unpack, merge) on this rank

    @classmethod
    def create(
        cls, rows: Sequence[SiteRow], histogram_width: int, enabled: bool, run_id: str = ""
    ) -> LiveMerge | None:
        """A live merge when ``enabled`` and a process group of more than one rank is up."""
        dist = torch.distributed
        if not (enabled and dist.is_available() and dist.is_initialized()):
            return None
        if dist.get_world_size() < 2:
            return None
        return cls(rows, histogram_width, run_id)

    def handshake(self) -> bool:
        """Whether every rank runs this live merge (decided once, the same on every rank).

        Each rank counts itself in the process group's store and waits up to
        :data:`HANDSHAKE_SECONDS` for all; the first decision written (``on`` by a rank that saw
        every rank arrive, ``off`` by one that timed out) is the one every rank adopts. A rank
        without a collector, or one with ``live_merge=False`` or another ``run_id``, therefore
        turns it off everywhere instead of leaving the others waiting in a gather.
        """
        store = torch.distributed.distributed_c10d._get_default_store()
        arrived, decision = self.key + "arrived", self.key + "decision"
        store.add(arrived, 1)
        vote, deadline = "off", time.monotonic() + HANDSHAKE_SECONDS
        while time.monotonic() < deadline:
            if store.check([decision]) or int(store.add(arrived, 0)) >= self.world_size:
                vote = "on"  # (a decision already written wins below whatever this vote is)
                break
            time.sleep(0.01)
        return store.compare_set(decision, "", vote).decode() == "on"

    def bytes_per_step(self, histogram_step: bool = False) -> int:
        """Bytes each rank sends per logged step."""
        return 8 * packed_width(len(self.rows), self.width if histogram_step else 0)

    # ------------------------------------------------------------------ pack / unpack
    def _slots(self) -> dict[tuple[str, int], int]:
        return {(r.stream, r.site_id): r.index for r in self.rows if r.site_id is not None}

    def pack(
        self, block: StepBlockRecord, batches: Sequence[ObservationBatch], histogram_step: bool
    ) -> np.ndarray:
        """This rank's step as one float64 vector of :func:`packed_width` floats."""
        n, w = len(self.rows), self.width if histogram_step else 0
        out = np.full(packed_width(n, w), np.nan)
        out[0] = np.nan if block.examples_seen is None else block.examples_seen
        out[1] = float(histogram_step)
        body = out[_HEADER : _HEADER + n * (1 + SPINE_WIDTH)].reshape(n, 1 + SPINE_WIDTH)
        body[:, 0] = _NOT_IN_BATCH
        hist = None
        if w:
            hist = out[_HEADER + n * (1 + SPINE_WIDTH) :].reshape(n, 1 + w)
            hist[:, 0] = 0.0
        slots = self._slots()
        for b in batches:  # a row key this rank cannot place is left out (never raise here:
            idx = _slot_index(slots, b)  # the other ranks may already wait in the gather)
            ok = idx >= 0
            body[idx[ok], 0] = b.presence[ok]
            body[idx[ok], 1:] = b.spines[ok]
            if hist is not None and b.hist_rows is not None and b.histograms is not None:
                rows = b.hist_rows[ok[b.hist_rows]]
                hist[idx[rows], 0] = 1.0
                hist[idx[rows], 1:] = b.histograms[ok[b.hist_rows]]  # < 2**53: exact
        return out

    def unpack(
        self, packed: np.ndarray, template: Sequence[ObservationBatch]
    ) -> list[ObservationBatch]:
        """One rank's batches, shaped like rank 0's ``template`` batches."""
        n = len(self.rows)
        w = self.width if packed[1] else 0
        body = packed[_HEADER : _HEADER + n * (1 + SPINE_WIDTH)].reshape(n, 1 + SPINE_WIDTH)
        hist = packed[_HEADER + n * (1 + SPINE_WIDTH) :].reshape(n, 1 + w) if w else None
        slots = self._slots()
        out = []
        for b in template:
            idx = _slot_index(slots, b)
            code = np.where(idx >= 0, body[idx, 0], _NOT_IN_BATCH)
            presence = np.where(code == _NOT_IN_BATCH, _ABSENT, code).astype(np.uint8)
            spines = body[idx, 1:].copy()
            hist_rows = histograms = None
            if hist is not None and b.hist_rows is not None:
                have = np.flatnonzero((idx >= 0) & (hist[idx, 0] > 0))
                if len(have):
                    hist_rows = have
                    histograms = hist[idx[have], 1:].astype(np.int64)
            notes = None
            if b.row_disclosures is not None:  # rank 0's texts where the presence agrees
                notes = tuple(
                    b.row_disclosures[j] if presence[j] == b.presence[j] else ()
                    for j in range(b.n_rows)
                )
            out.append(
                replace(
                    b,
                    presence=presence,
                    spines=spines,
                    hist_rows=hist_rows,
                    histograms=histograms,
                    row_disclosures=notes if notes and any(notes) else None,
                )
            )
        return out

    # ------------------------------------------------------------------ the collective
    def merge(
        self, block: StepBlockRecord, batches: Sequence[ObservationBatch], histogram_step: bool
    ) -> tuple[StepBlockRecord, list[ObservationBatch]] | None:
        """Gather every rank's step; on rank 0 the merged ``(block, batches)``, else ``None``.

        Every rank must call this at the same steps (it is a collective).
        """
        if self.agreed is None:
            self.agreed = self.handshake()
        if not self.agreed:
            raise RuntimeError(
                f"not every rank joined within {HANDSHAKE_SECONDS:g} s (a rank without a "
                "collector, with live_merge=False, or with another run_id)"
            )
        t0 = time.perf_counter()
        try:
            return self._merge(block, batches, histogram_step)
        finally:
            self.seconds += time.perf_counter() - t0

    def _merge(
        self, block: StepBlockRecord, batches: Sequence[ObservationBatch], histogram_step: bool
    ) -> tuple[StepBlockRecord, list[ObservationBatch]] | None:
        packed = torch.from_numpy(self.pack(block, batches, histogram_step)).to(self.device)
        gathered = (
            [torch.empty_like(packed) for _ in range(self.world_size)] if self.rank == 0 else None
        )
        torch.distributed.gather(packed, gathered, dst=0, group=self.group)
        self.collectives += 1
        self.bytes_sent += packed.numel() * 8
        if gathered is None:
            return None
        host = torch.stack(gathered).cpu().numpy()  # the one device-to-host copy on rank 0
        per_rank = [self.unpack(row, batches) for row in host]
        blocks = [replace(block, examples_seen=None if np.isnan(r[0]) else int(r[0])) for r in host]
        merged_block, _ = merge_step_blocks(blocks, self.world_size)
        return merged_block, merge_step_batches(per_rank)


def safe_merge(
    live: LiveMerge | None,
    block: StepBlockRecord,
    batches: Sequence[ObservationBatch],
    histogram_step: bool,
) -> tuple[LiveMerge | None, tuple[StepBlockRecord, list[ObservationBatch]] | None]:
    """:meth:`LiveMerge.merge` that never raises into training: a failure turns it off."""
    if live is None:
        return None, None
    try:
        return live, live.merge(block, batches, histogram_step)
    except Exception as e:  # telemetry never breaks the step: warn and stop merging live
        warnings.warn(
            f"stepscope: the live rank merge failed ({type(e).__name__}: {e}); it is off for "
            "the rest of this run (the per-rank segments are unaffected).",
            RuntimeWarning,
            stacklevel=3,
        )
        return None, None

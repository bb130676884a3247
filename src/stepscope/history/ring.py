"""The RAM ring of recent step blocks.

With the disk archive on, the ring is a plain LRU cache (eviction is not an event: the data is on
disk). Without disk, what happens when it is full is one of three *explicit* policies, never
switched automatically:

``refuse`` (default)
    :meth:`StepRing.check_room` / :meth:`StepRing.push` raise ``ring_capacity_exhausted`` before
    the block that would not fit; nothing already held is touched.
``drop_oldest``
    the oldest block is dropped and counted (``dropped_blocks``, ``dropped_steps``).
``coarsen``
    the oldest adjacent pair of equal span merges (else the pair with the fewest combined
    steps) exactly — counts add, Chan moments — into one block spanning ``[step_lo, step_hi]``;
    older history becomes coarser, recent steps stay single.

Example
-------
>>> ring = StepRing(capacity=2, policy="drop_oldest")
>>> from stepscope.history.schema import StepBlockRecord
>>> for s in range(3):
...     ring.push(StepBlockRecord(s), [])
>>> [b.step_lo for b in ring.blocks()], ring.dropped_blocks
([1, 2], 1)
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.codec import parse_enum
from stepscope.errors import Refusal
from stepscope.history.batch import ObservationBatch
from stepscope.history.merge import merge_step_batches
from stepscope.history.schema import StepBlockRecord

DEFAULT_CAPACITY = 256


class RingPolicy(str, enum.Enum):
    """What a RAM-only ring does when full."""

    REFUSE = "refuse"
    DROP_OLDEST = "drop_oldest"
    COARSEN = "coarsen"


@dataclass(frozen=True)
class RingBlock:
    """One held block: a single step, or a coarsened span ``[step_lo, step_hi]``.

    ``block`` is the newest step's record; ``n_steps`` counts the steps merged into it.
    """

    step_lo: int
    step_hi: int
    n_steps: int
    block: StepBlockRecord
    batches: tuple[ObservationBatch, ...]


def coarsen_pair(older: RingBlock, newer: RingBlock) -> RingBlock:
    """Merge two adjacent blocks exactly (counts add, Chan moments); spans join."""
    return RingBlock(
        step_lo=older.step_lo,
        step_hi=newer.step_hi,
        n_steps=older.n_steps + newer.n_steps,
        block=newer.block,
        batches=tuple(merge_step_batches([older.batches, newer.batches])),
    )


class StepRing:
    """A bounded in-memory store of recent step blocks.

    Parameters
    ----------
    capacity
        Maximum blocks held (default 256).
    policy
        RAM-only behaviour at capacity (:class:`RingPolicy`); must stay ``refuse`` when
        ``disk_backed`` (the ring is then an LRU cache).
    disk_backed
        True when an artifact writer keeps every block on disk.
    """

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        policy: RingPolicy | str = RingPolicy.REFUSE,
        *,
        disk_backed: bool = False,
    ) -> None:
        self.policy = parse_enum(RingPolicy, policy, "ring policy", "settings_invalid")
        if not isinstance(capacity, int) or capacity < 1:
            raise Refusal("settings_invalid", f"ring capacity {capacity!r} must be an int >= 1.")
        if self.policy is RingPolicy.COARSEN and capacity < 2:
            raise Refusal("settings_invalid", "the coarsen policy needs capacity >= 2.")
        if disk_backed and self.policy is not RingPolicy.REFUSE:
            raise Refusal(
                "settings_invalid",
                f"policy {self.policy.value!r} applies to a RAM-only ring; with the disk archive "
                "on, the ring is an LRU cache.",
                ["drop the policy argument", "or turn the disk archive off"],
            )
        self.capacity, self.disk_backed = capacity, disk_backed
        self._blocks: OrderedDict[int, RingBlock] = OrderedDict()  # step_lo -> block
        self.dropped_blocks = 0
        self.dropped_steps = 0
        self.coarsen_merges = 0
        self.evicted = 0
        self._last_step: int | None = None

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def full(self) -> bool:
        """Whether the next push meets the capacity policy."""
        return len(self._blocks) >= self.capacity

    def check_room(self) -> None:
        """Refuse now if the next block could not be stored (``refuse`` policy, RAM-only).

        A collector calls this *before* scheduling a step, so nothing is computed or lost.
        """
        if self.full and not self.disk_backed and self.policy is RingPolicy.REFUSE:
            raise Refusal(
                "ring_capacity_exhausted",
                f"the RAM ring holds its capacity of {self.capacity} step blocks and the policy "
                "is 'refuse'; the next block was not taken and nothing was dropped.",
                [
                    "record to disk (the default without in_memory=True): HistoryCollector("
                    'model, settings=WatchSettings(name="<name>")) writes '
                    "runs/<name>/version_<N> (crash-safe, no step limit)",
                    "raise ram_capacity",
                    "choose ram_policy='drop_oldest' or 'coarsen' explicitly",
                    "read or clear the ring (ring.clear()) before continuing",
                ],
            )

    def push(self, block: StepBlockRecord, batches: Sequence[ObservationBatch]) -> None:
        """Add one step block, applying the policy when full."""
        step = block.optimizer_step
        if self._last_step is not None and step <= self._last_step:
            raise Refusal(
                "history_step_out_of_order", f"ring got step {step} after {self._last_step}."
            )
        if len(self._blocks) >= self.capacity:  # full: the policy applies
            self.check_room()
            if self.disk_backed:
                self._blocks.popitem(last=False)  # least recently used
                self.evicted += 1
            elif self.policy is RingPolicy.DROP_OLDEST:
                oldest = min(self._blocks)
                self.dropped_steps += self._blocks.pop(oldest).n_steps
                self.dropped_blocks += 1
            else:
                self._coarsen_once()
        self._blocks[step] = RingBlock(step, step, 1, block, tuple(batches))
        self._last_step = step

    def _coarsen_once(self) -> None:
        ordered = [self._blocks[k] for k in sorted(self._blocks)]
        pairs = list(itertools.pairwise(ordered))
        equal = [i for i, (a, b) in enumerate(pairs) if a.n_steps == b.n_steps]
        if equal:  # oldest pair of equal spans: older history ends up coarser, like a counter
            i = equal[0]
        else:
            cost = [a.n_steps + b.n_steps for a, b in pairs]
            i = cost.index(min(cost))
        merged = coarsen_pair(ordered[i], ordered[i + 1])
        del self._blocks[ordered[i + 1].step_lo]
        self._blocks[ordered[i].step_lo] = merged
        self.coarsen_merges += 1

    def get(self, step: int) -> RingBlock | None:
        """The held block whose span contains ``step`` (marks it recently used), or None."""
        for key, b in self._blocks.items():
            if b.step_lo <= step <= b.step_hi:
                self._blocks.move_to_end(key)
                return b
        return None

    def blocks(self) -> list[RingBlock]:
        """Held blocks in step order."""
        return [self._blocks[k] for k in sorted(self._blocks)]

    def clear(self) -> None:
        """Drop every held block (counters are kept)."""
        self._blocks.clear()

"""Deterministic distributed sampling over packed blocks: which block each rank reads at each micro-step.

Same (seed, world size, rank, micro-step) -> same blocks, on every numpy/torch version, so a resumed run
continues exactly where the interrupted one stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from launcher.errors import UserInputError

_GOLDEN64 = 0x9E3779B97F4A7C15


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele, Lea & Flood, OOPSLA 2014): a bijection on uint64 that scrambles bits.
    Defined here, not drawn from a library RNG, so an order is the same on every numpy/torch version."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@dataclass(frozen=True)
class BlockOrder:
    """Deterministic distributed sampling: which block each rank reads at each micro-step, resumable.

    Epoch e is a permutation of range(n_blocks) fixed by (seed, e). Rank r takes every world_size-th entry
    starting at r, cut to `blocks_per_rank` = n_blocks // world_size so all ranks step through epochs together
    (within an epoch the ranks' blocks are disjoint; the n_blocks % world_size left over differ each epoch).
    Each rank reads its entries as one endless stream, epoch after epoch, `micro_batch` per micro-step, so
    (seed, world_size, rank, micro_step) fixes the indices and resuming only needs the micro-step count.
    """

    n_blocks: int
    world_size: int
    rank: int
    seed: int
    micro_batch: int = 1  # default for batch() and micro_steps_per_epoch
    _epochs: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # epoch -> permutation

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size or self.micro_batch < 1:
            raise ValueError(f"bad BlockOrder: rank {self.rank} of {self.world_size}, micro_batch {self.micro_batch}")
        if self.n_blocks < self.world_size:
            raise UserInputError(
                f"the data yields {self.n_blocks} blocks, fewer than the {self.world_size} ranks that each need one; "
                f"add data, lower --seq-len or use fewer GPUs"
            )

    @property
    def blocks_per_rank(self) -> int:
        """Blocks each rank reads per epoch."""
        return self.n_blocks // self.world_size

    @property
    def micro_steps_per_epoch(self) -> int:
        """Micro-steps per epoch at `micro_batch` (for --epochs): floor(n_blocks / (world_size * micro_batch))."""
        return max(1, self.n_blocks // (self.world_size * self.micro_batch))

    def epoch(self, micro_step: int, micro_batch: int | None = None) -> int:
        """The epoch the first block of `micro_step` comes from."""
        return micro_step * (micro_batch or self.micro_batch) // self.blocks_per_rank

    def batch(self, micro_step: int, micro_batch: int | None = None) -> list[int]:
        """Indices of the blocks this rank reads at global micro-step `micro_step` (0-based)."""
        size = self.micro_batch if micro_batch is None else micro_batch
        if micro_step < 0 or size < 1:
            raise ValueError(f"micro_step must be >= 0 and micro_batch >= 1, got {micro_step} and {size}")
        out = []
        for position in range(micro_step * size, (micro_step + 1) * size):
            epoch, offset = divmod(position, self.blocks_per_rank)
            out.append(int(self.permutation(epoch)[self.rank + offset * self.world_size]))
        return out

    def permutation(self, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s order of all blocks: sort the blocks by a keyed hash of their index."""
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:  # keep the current and the next epoch only
                self._epochs.pop(min(self._epochs))
            seed = (self.seed % 2**64 * _GOLDEN64 + epoch) % 2**64
            key = _mix64(np.array([seed], dtype=np.uint64))
            keys = _mix64(np.arange(self.n_blocks, dtype=np.uint64) ^ key)  # distinct, so the sort has no ties
            self._epochs[epoch] = np.argsort(keys, kind="stable")
        return self._epochs[epoch]

"""``Sampler``: the order a training job reads a dataset in, the same at any world size, resumable.

The global order of an epoch is :func:`h5forge.read.order.epoch_order` (seeded, uniform or
block-shuffled). Rank ``r`` of ``W`` takes the global positions ``r, r + W, r + 2W, ...``, so
the ranks together walk the one global sequence in steps of ``W`` samples, whatever ``W`` is.
State is counted in global samples consumed (the *position*): a job saved at position ``p`` on 8
GPUs and resumed on 2 continues at ``p`` with the same sequence.

How an epoch ends on ``W`` ranks, from a starting position ``s`` (0 unless resumed):

- training, ``drop_last=False`` (the default): the sequence is padded by wrapping around to its
  start until every rank has the same count, ``ceil((n - s) / W)``, as ``DistributedSampler``
  does; up to ``W - 1`` samples are read twice.
- training, ``drop_last=True``: the tail is dropped instead, every rank gets
  ``(n - s) // W``; up to ``W - 1`` samples are not read this epoch (another epoch's order
  drops others).
- ``exact=True`` (evaluation): every sample goes to exactly one rank, nothing padded or dropped;
  the ranks' counts differ by at most one (rank ``r`` gets ``ceil((n - s - r) / W)``), so a
  collective op per batch needs care on the last step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch.utils.data

from h5forge.read.order import (
    MAX_COUNT,
    block_locality,
    check_int,
    epoch_order,
    shown,
    uniform_locality,
)

__all__ = ["Sampler"]

_ORDER_KEYS = ("n", "seed", "shuffle", "block_size", "window")

#: Batches of epoch 0 that :meth:`Sampler.locality` measures (enough for a steady mean, few
#: enough that a huge dataset costs no more than its first windows).
LOCALITY_BATCHES = 256


def _distributed() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _count(n: int, start: int, rank: int, world: int, *, exact: bool, drop_last: bool) -> int:
    left = n - start
    if exact:
        return max(0, -(-(left - rank) // world))
    return left // world if drop_last else -(-left // world)


class Sampler(torch.utils.data.Sampler[int]):
    """A seeded, per-epoch shuffle over a dataset, split between distributed ranks.

    ``for i in Sampler(ds)`` yields this rank's dataset indices for one epoch. Use it with any
    ``DataLoader`` (``sampler=``) or through :meth:`h5forge.H5ImageDataset.loader`, which uses
    it by default.

    Epochs: ``set_epoch(e)`` chooses the epoch of the next iteration, as with
    ``DistributedSampler``. Without it, each new iteration after the first advances the epoch
    by one, so ``for epoch in range(k): for batch in loader: ...`` sees a fresh order each epoch
    with no call at all. ``len()`` is the number of indices the next iteration yields (after a
    resume: the rest of the epoch).

    Ranges (:data:`~h5forge.read.order.MAX_COUNT` is 2**62, which keeps every position within
    int64): the length ``n`` is ``0..MAX_COUNT``, ``world_size`` ``1..MAX_COUNT``, ``rank``
    ``0..world_size - 1``, ``block_size`` and ``window`` ``1..MAX_COUNT``; ``seed`` and the
    epoch are any integer >= 0.

    Args:
        data_source: the dataset (its ``len()``; with ``split=`` that is the split's) or a length.
        shuffle: a fresh order each epoch; ``False`` visits ``0..n-1`` in order.
        seed: with the epoch, fixes the order (every rank must use the same seed).
        block_size: ``None`` for a uniform shuffle; else the block shuffle of
            :func:`~h5forge.read.order.epoch_order` (neighbouring samples read together).
        window: blocks shuffled together, with ``block_size``. For remote reads choose
            ``block_size * window == batch_size`` (e.g. 16 x 4 for 64): each batch is then one
            window, a few range requests, and no two workers fetch the same bytes.
        rank, world_size: this process's rank and the number of ranks; by default taken from
            ``torch.distributed`` when it is initialised, else 0 and 1.
        drop_last: training: drop the tail so every rank gets ``(n - s) // W`` (see the module).
        exact: evaluation: every sample to exactly one rank, no padding (counts differ by <= 1).

    Raises:
        ValueError: an argument is out of range (named, with its value and range), or
            ``exact`` and ``drop_last`` are both given.
    """

    def __init__(
        self,
        data_source: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        block_size: int | None = None,
        window: int = 4,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        exact: bool = False,
    ) -> None:
        n = data_source if isinstance(data_source, int) else len(data_source)
        epoch_order(0, seed=seed, block_size=block_size, window=window)  # checks the arguments
        if isinstance(n, bool) or not 0 <= n <= MAX_COUNT:
            raise ValueError(
                f"data_source={shown(data_source)}: a length must be an int in 0..2**62"
            )
        if exact and drop_last:
            raise ValueError(
                "exact=True gives every sample to one rank; drop_last=True drops some: "
                "choose one (exact for evaluation, drop_last for training)"
            )
        if (rank is None) != (world_size is None):
            raise ValueError(f"give rank and world_size together (got {rank=}, {world_size=})")
        if rank is None or world_size is None:
            rank, world_size = _distributed()
        world_size = check_int("world_size", world_size, 1, MAX_COUNT)
        rank = check_int("rank", rank, 0)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in 0..{world_size - 1} (world_size)")
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.block_size, self.window = block_size, window
        self.rank, self.world_size = rank, world_size
        self.drop_last, self.exact = drop_last, exact
        self._epoch = 0  # the epoch and start position of the next iteration
        self._position = 0
        self._current: tuple[int, int] | None = None  # (epoch, start) of the last iteration
        self._yielded = 0

    # --- the order ------------------------------------------------------------------------
    def indices(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's indices of ``epoch`` (any int >= 0) from global position ``start``
        (``0..n``): an int64 array."""
        start = check_int("start", start, 0, self.n)
        order = epoch_order(
            self.n,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            block_size=self.block_size,
            window=self.window,
        )
        count = self._count(start)
        positions = start + self.rank + self.world_size * np.arange(count, dtype=np.int64)
        return order[positions % self.n] if self.n else order

    def locality(self, batch_size: int, block_size: int | None = None) -> float:
        """The randomness of this rank's batches: :func:`~h5forge.read.order.block_locality`,
        the mean number of distinct ``block_size`` blocks (default: this sampler's own) per
        batch of ``batch_size``, over the first :data:`LOCALITY_BATCHES` (256) batches of epoch 0.
        Compare it with :func:`~h5forge.read.order.uniform_locality` (about ``batch_size`` for a
        large dataset): lower means fewer range requests per batch and less random batches.
        When ``block_size`` does not divide the length, the one short block shifts the windows
        after it against the batches, which then straddle two windows (4.5 blocks per batch
        of 64 over a whole epoch of 1,281,167 samples with 16 x 4, against 4.0 before it);
        the first 256 batches show this only when the short block falls among them.

        Raises:
            ValueError: ``batch_size`` or ``block_size`` is not an integer in ``1..2**62``, or
                this sampler has no blocks and ``block_size`` is not given.
        """
        batch_size = check_int("batch_size", batch_size, 1, MAX_COUNT)
        if block_size is None:
            if self.block_size is None:
                raise ValueError(
                    "this Sampler has no blocks (block_size=None): give locality() the "
                    "block_size to count"
                )
            block_size = self.block_size
        block_size = check_int("block_size", block_size, 1, MAX_COUNT)
        count = min(self._count(0), LOCALITY_BATCHES * batch_size)
        if count == 0 or self.n == 0:
            return 0.0
        positions = self.rank + self.world_size * np.arange(count, dtype=np.int64)
        head = epoch_order(
            self.n,
            seed=self.seed,
            shuffle=self.shuffle,
            block_size=self.block_size,
            window=self.window,
            count=min(self.n, int(positions[-1]) + 1),
        )
        return block_locality(head[positions % self.n], batch_size, block_size)

    def describe(self, batch_size: int) -> str:
        """The order in a line: ``"blocks of 16 samples, 4 per window: 4.0 distinct blocks
        per batch of 64 vs ~63.0 for a uniform shuffle"``, ``"a uniform shuffle"`` or ``"in
        order (no shuffle)"``."""
        if not self.shuffle:
            return "in order (no shuffle)"
        if self.block_size is None:
            return "a uniform shuffle"
        size = self.block_size
        return (
            f"blocks of {size} samples, {self.window} per window: "
            f"{self.locality(batch_size):.1f} distinct blocks per batch of {batch_size} "
            f"vs ~{uniform_locality(self.n, batch_size, size):.1f} for a uniform shuffle"
        )

    def _count(self, start: int) -> int:
        return _count(
            self.n, start, self.rank, self.world_size, exact=self.exact, drop_last=self.drop_last
        )

    def __len__(self) -> int:
        return self._count(self._position)

    def __iter__(self) -> Iterator[int]:
        epoch, start = self._epoch, self._position
        self._current, self._yielded = (epoch, start), 0
        self._epoch, self._position = epoch + 1, 0  # the next iteration, unless set otherwise
        mine = self.indices(epoch, start)
        for lo in range(0, len(mine), 1 << 16):  # Python ints a chunk at a time, not n at once
            for i in mine[lo : lo + (1 << 16)].tolist():
                self._yielded += 1
                yield i

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next iteration (from its start, unless a loaded state
        points into this very epoch)."""
        epoch_order(0, epoch=epoch)  # checks it
        if epoch != self._epoch:
            self._position = 0
        self._epoch = int(epoch)
        self._current = None

    # --- state ----------------------------------------------------------------------------
    def state(self, consumed: int) -> dict[str, Any]:
        """The state once this rank has consumed ``consumed`` indices of the current iteration:
        ``{"epoch", "position", ...}``, the position in global samples. In ``exact`` mode
        save rank 0's state (it has the most samples)."""
        consumed = check_int("consumed", consumed, 0)
        if self._current is None:
            epoch, position = self._epoch, self._position
        else:
            epoch, start = self._current
            position = start + consumed * self.world_size
            if consumed >= self._count(start) or position >= self.n:
                epoch, position = epoch + 1, 0  # the epoch is over
        order = {k: getattr(self, k) for k in _ORDER_KEYS}
        return {"epoch": epoch, "position": position, **order}

    def state_dict(self) -> dict[str, Any]:
        """``state`` after what this sampler yielded (for a plain loop or StatefulDataLoader,
        which snapshots it per batch; ``loader()`` counts batches itself)."""
        return self.state(self._yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from any world size): the next iteration starts at its
        position.

        Raises:
            ValueError: the state is malformed, or was saved for another order (length, seed,
                shuffle, block_size or window differ).
        """
        if not isinstance(state, dict) or not {"epoch", "position", *_ORDER_KEYS} <= set(state):
            raise ValueError(
                f"not a Sampler state: {state!r:.200}; expected the dict of Sampler.state_dict()"
            )
        for key in _ORDER_KEYS:
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the state was saved for {key}={shown(state[key])}, this sampler has "
                    f"{key}={getattr(self, key)!r}: it would continue another order; build the "
                    "Sampler over the same dataset with the same seed, shuffle, block_size "
                    "and window"
                )
        epoch, position = state["epoch"], state["position"]
        epoch_order(0, epoch=epoch)  # checks it
        if (
            isinstance(position, bool)
            or not isinstance(position, int)
            or not 0 <= position <= self.n
        ):
            raise ValueError(f"state position={shown(position)} must be an int in 0..{self.n}")
        self._epoch, self._position, self._current = int(epoch), position, None

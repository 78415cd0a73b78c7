"""The global sample order of one epoch: a seeded permutation, whole or block-shuffled.

One function, :func:`epoch_order`, decides the order in which an epoch visits the samples of a
dataset of ``n`` items. It depends only on ``(n, seed, epoch, block_size, window)``: never on the
number of ranks or workers, so every process of a job computes the same sequence, and a job
restarted on another number of GPUs sees the same one.

- ``block_size=None``: a uniform random permutation of ``range(n)`` (numpy's PCG64 seeded with
  ``(seed, epoch)``; stable across platforms and numpy versions that keep PCG64).
- ``block_size=B``: the index range is cut into contiguous blocks of ``B`` samples (the last may
  be shorter); the blocks are permuted, then each run of ``window`` consecutive blocks of that
  permutation is merged and its samples permuted. A batch therefore draws from about ``window``
  blocks of neighbouring samples, so a remote reader can fetch it with a few large range
  requests instead of one per sample. The price is randomness: samples of one block meet more
  often than in a uniform shuffle. :func:`block_locality` measures it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["block_locality", "epoch_order"]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    return int(value)


def epoch_order(
    n: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    block_size: int | None = None,
    window: int = 4,
) -> np.ndarray:
    """The visiting order of ``range(n)`` for ``epoch``: an int64 array, a permutation.

    Args:
        n: number of samples (>= 0).
        seed: the job's seed (>= 0); with ``epoch`` it fixes the order.
        epoch: the epoch number (>= 0); each epoch gets a fresh order.
        shuffle: ``False`` gives ``0..n-1`` in order (``seed``, ``epoch``, blocks ignored).
        block_size: ``None`` for a uniform shuffle; else samples per contiguous block (>= 1).
        window: blocks merged and shuffled together (>= 1); only with ``block_size``.

    Raises:
        ValueError: an argument is not an integer in its range.
    """
    n = _check_int("n", n, 0)
    seed = _check_int("seed", seed, 0)
    epoch = _check_int("epoch", epoch, 0)
    if block_size is not None:
        block_size = _check_int("block_size", block_size, 1)
    window = _check_int("window", window, 1)
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    if block_size is None or block_size >= n:
        return rng.permutation(n).astype(np.int64, copy=False)
    starts = np.arange(0, n, block_size, dtype=np.int64)
    starts = starts[rng.permutation(len(starts))]
    parts = []
    for g in range(0, len(starts), window):
        group = np.concatenate(
            [np.arange(s, min(s + block_size, n)) for s in starts[g : g + window]]
        )
        parts.append(group[rng.permutation(len(group))])
    return np.concatenate(parts).astype(np.int64, copy=False)


def block_locality(order: np.ndarray, batch_size: int, block_size: int) -> float:
    """Mean number of distinct ``block_size`` blocks per batch of ``order``.

    A uniform shuffle of a large dataset gives about ``batch_size`` (every sample of a batch in
    its own block); a block shuffle gives about ``window``. The lower it is, the fewer range
    requests a batch costs and the less random the batches are.
    """
    batch_size = _check_int("batch_size", batch_size, 1)
    block_size = _check_int("block_size", block_size, 1)
    blocks = np.asarray(order, dtype=np.int64) // block_size
    counts = [len(np.unique(blocks[i : i + batch_size])) for i in range(0, len(blocks), batch_size)]
    return float(np.mean(counts)) if counts else 0.0

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

__all__ = [
    "MAX_COUNT",
    "block_locality",
    "check_int",
    "epoch_order",
    "shown",
    "uniform_locality",
]

#: The most samples, blocks, ranks or draws an order counts (2**62): with it, every position
#: computed from them (a sample's global position, padded by up to ``world_size`` more) stays
#: below 2**63, so int64 arrays and ``len()`` (at most ``sys.maxsize``) hold it. A dataset
#: this large would need 32 EiB for one epoch's order; the bound only keeps the arithmetic
#: exact. Seeds and epochs are unbounded integers >= 0 (numpy's ``SeedSequence`` takes any).
MAX_COUNT = 2**62


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int when it is an integer (not a bool) in ``minimum..maximum``.

    Raises:
        ValueError: naming ``name``, the value and the range.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{_power(maximum)}"
        raise ValueError(f"{name}={shown(value)} must be an integer {bound}")
    return int(value)


def shown(value: object) -> str:
    """``repr(value)`` for a message, at most 80 characters; an int of more than 30 digits
    by its size (``repr`` of one over 4300 digits raises ValueError)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"{'-' if value < 0 else ''}(an integer of {value.bit_length()} bits)"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(shown(x) for x in value[:8]) + (", ..." if len(value) > 8 else "")
        return f"[{inner}]"[:120]
    return f"{value!r:.80}"


def _power(value: int) -> str:
    """``2**62`` rather than 4611686018427387904 in a message."""
    exponent = value.bit_length() - 1
    return f"2**{exponent}" if value == 1 << exponent and exponent > 16 else str(value)


def epoch_order(
    n: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    block_size: int | None = None,
    window: int = 4,
    count: int | None = None,
) -> np.ndarray:
    """The visiting order of ``range(n)`` for ``epoch``: an int64 array, a permutation.

    Args:
        n: number of samples, ``0..MAX_COUNT`` (2**62).
        seed: the job's seed, any integer >= 0; with ``epoch`` it fixes the order.
        epoch: the epoch number, any integer >= 0; each epoch gets a fresh order.
        shuffle: ``False`` gives ``0..n-1`` in order (``seed``, ``epoch``, blocks ignored).
        block_size: ``None`` for a uniform shuffle; else samples per contiguous block,
            ``1..MAX_COUNT``.
        window: blocks merged and shuffled together, ``1..MAX_COUNT``; only with
            ``block_size``.
        count: only the first ``count`` positions (``0..n``; ``None``: all ``n``): the same as
            ``epoch_order(...)[:count]``; a block order then computes its first windows alone.

    Raises:
        ValueError: an argument is not an integer in its range.
    """
    n = check_int("n", n, 0, MAX_COUNT)
    seed = check_int("seed", seed, 0)
    epoch = check_int("epoch", epoch, 0)
    if block_size is not None:
        block_size = check_int("block_size", block_size, 1, MAX_COUNT)
    window = check_int("window", window, 1, MAX_COUNT)
    count = n if count is None else check_int("count", count, 0, n)
    if not shuffle:
        return np.arange(count, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    if block_size is None or block_size >= n:
        return rng.permutation(n)[:count].astype(np.int64, copy=False)
    starts = np.arange(0, n, block_size, dtype=np.int64)
    starts = starts[rng.permutation(len(starts))]
    parts, done = [np.empty(0, dtype=np.int64)], 0
    for g in range(0, len(starts), window):
        if done >= count:  # the windows after this draw from the same stream: stopping is exact
            break
        group = np.concatenate(
            [np.arange(s, min(s + block_size, n)) for s in starts[g : g + window]]
        )
        parts.append(group[rng.permutation(len(group))])
        done += len(group)
    return np.concatenate(parts)[:count].astype(np.int64, copy=False)


def block_locality(order: np.ndarray, batch_size: int, block_size: int) -> float:
    """Mean number of distinct ``block_size`` blocks per batch of ``order``.

    A uniform shuffle of a large dataset gives about ``batch_size`` (every sample of a batch in
    its own block); a block shuffle gives about ``window``. The lower it is, the fewer range
    requests a batch costs and the less random the batches are. ``batch_size`` and
    ``block_size`` are integers in ``1..MAX_COUNT``.
    """
    batch_size = check_int("batch_size", batch_size, 1, MAX_COUNT)
    block_size = check_int("block_size", block_size, 1, MAX_COUNT)
    blocks = np.asarray(order, dtype=np.int64) // block_size
    counts = [len(np.unique(blocks[i : i + batch_size])) for i in range(0, len(blocks), batch_size)]
    return float(np.mean(counts)) if counts else 0.0


def uniform_locality(n: int, batch_size: int, block_size: int) -> float:
    """Expected :func:`block_locality` of a uniform shuffle of ``n`` samples: the mean number
    of distinct ``block_size`` blocks a batch of ``batch_size`` touches (``n // block_size``
    whole blocks, each missed by a batch with probability ``C(n - B, b) / C(n, b)``; the short
    last block is left out, so this is a close estimate, not an exact figure). The baseline a
    block order's locality is compared with."""
    n = check_int("n", n, 0, MAX_COUNT)
    b = min(check_int("batch_size", batch_size, 1, MAX_COUNT), n)
    size = check_int("block_size", block_size, 1, MAX_COUNT)
    blocks = n // size
    if blocks == 0 or b == 0:
        return float(b > 0)
    if n - size < b:  # every batch touches every block
        return float(blocks)
    # log of prod_{i < b} (n - size - i) / (n - i), in chunks (b may be large)
    log_miss = 0.0
    for lo in range(0, b, 1 << 16):
        i = np.arange(lo, min(b, lo + (1 << 16)), dtype=np.float64)
        log_miss += float(np.sum(np.log1p(-size / (n - i))))
    return float(blocks * -np.expm1(log_miss))

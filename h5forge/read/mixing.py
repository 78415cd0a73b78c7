"""Which samples of several assets are read: a seeded subset, and mixing in fixed proportions.

:func:`select_subset` picks the subset of an :class:`~h5forge.read.multi.H5MultiDataset`.
:class:`MixingSampler` yields indices of an :class:`~h5forge.read.multi.H5MultiDataset` so that
each epoch draws every asset its share of the time (the exact rule is in its docstring). It
depends only on the assets' sizes, the weights, the epoch length, the seed and the epoch, so
every process of a job computes the same sequence.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch.utils.data import Sampler

from h5forge.read.order import MAX_COUNT, check_int, epoch_order, shown

if TYPE_CHECKING:
    from h5forge.read.multi import H5MultiDataset

__all__ = ["MAX_WEIGHT", "MixingSampler", "select_subset"]

#: The largest mixing weight: the largest float. Weights are ratios; any finite positive ones
#: are taken, from the smallest subnormal (5e-324) up, and shared out exactly.
MAX_WEIGHT = sys.float_info.max


def select_subset(subset: Sequence[int] | float, total: int, *, seed: int) -> np.ndarray:
    """Indices (int64) of a subset of ``range(total)``: ``subset`` itself when it is a list
    (its order kept, repeats allowed), else that fraction in (0, 1] of the indices, drawn with
    ``seed`` and sorted.

    Raises:
        ValueError: a fraction outside (0, 1] or selecting nothing, a list that is not flat
            integers, or an index outside ``range(total)``.
    """
    if isinstance(subset, float):
        if not 0.0 < subset <= 1.0:  # first: 1e308 * total would overflow round()
            raise ValueError(f"subset={subset!r} of {total} samples: give a fraction in (0, 1]")
        k = round(subset * total)
        if k == 0:
            raise ValueError(
                f"subset={subset!r} of {total} samples selects none: give a fraction in (0, 1] "
                "that selects at least one"
            )
        rng = np.random.default_rng(check_int("seed", seed, 0))
        return np.sort(rng.choice(total, size=k, replace=False)).astype(np.int64)
    if isinstance(subset, (str, bytes)) or not isinstance(subset, Sequence | np.ndarray):
        raise ValueError(
            f"subset must be None, a fraction or a list of indices, not {subset!r:.80}"
        )
    picks = np.asarray(subset)
    if picks.ndim == 1 and picks.dtype.kind == "O" and all(_is_int(x) for x in picks.tolist()):
        # Python ints beyond int64/uint64 (numpy keeps them as objects): out of range.
        bad = next((x for x in picks.tolist() if not 0 <= x < total), None)
        if bad is not None:
            raise ValueError(
                f"subset index {shown(bad)} out of range for {total} samples (0..{total - 1})"
            )
    if picks.ndim != 1 or (picks.size and picks.dtype.kind not in "iu"):
        raise ValueError(f"subset must be a flat list of integer indices, not {subset!r:.80}")
    outside = (picks < 0) | (picks >= total)  # before the cast: a uint64 >= 2**63 would wrap
    if outside.any():
        bad = int(picks[np.flatnonzero(outside)[0]])
        raise ValueError(f"subset index {bad} out of range for {total} samples (0..{total - 1})")
    return picks.astype(np.int64)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_weights(weights: object, count: int) -> list[float]:
    """``weights`` as floats: ``count`` numbers, each finite, > 0 and at most the largest
    float (an int beyond it has no float).

    Raises:
        ValueError: naming the weights and the accepted range.
    """
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence | np.ndarray):
        raise ValueError(f"weights={shown(weights)} must be a list of {count} numbers")
    w = list(weights)
    if len(w) != count:
        raise ValueError(f"weights={shown(w)} must be {count} numbers, one per asset")
    for k, x in enumerate(w):
        # A comparison, not float(x): exact for an int of any size; NaN fails it.
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= MAX_WEIGHT:
            raise ValueError(
                f"weights[{k}]={shown(x)} must be a finite number in (0, {MAX_WEIGHT!r}] "
                "(a weight's share is its ratio to their sum; any ratio is taken)"
            )
    return [float(x) for x in w]


def _exact(weights: list[float]) -> tuple[list[int], int]:
    """Each weight as an integer numerator over one common denominator, and their sum: the
    shares ``w_s / sum(w)`` exactly (a float is a dyadic rational, so the largest of the
    power-of-two denominators is a multiple of all of them). No weight, however large or
    small (1.8e308, 5e-324), overflows or vanishes."""
    ratios = [x.as_integer_ratio() for x in weights]
    den = max(d for _, d in ratios)
    nums = [n * (den // d) for n, d in ratios]
    return nums, sum(nums)


def _stream(n: int, start: int, count: int, key: list[int]) -> np.ndarray:
    """Items ``start .. start+count`` of an endless stream of fresh permutations of ``range(n)``
    (permutation number ``c`` seeded with ``key + [c]``)."""
    out = np.empty(count, dtype=np.int64)
    filled, t = 0, start
    while filled < count:
        cycle, offset = divmod(t, n)
        take = min(n - offset, count - filled)
        perm = np.random.default_rng([*key, cycle]).permutation(n)
        out[filled : filled + take] = perm[offset : offset + take]
        filled, t = filled + take, t + take
    return out


class MixingSampler(Sampler[int]):
    """Indices of an :class:`H5MultiDataset` drawn from its assets in fixed proportions.

    The rule, for ``S`` assets of ``n_s`` samples (after split and subset) and weights ``w_s``
    (``p_s = w_s / sum(w)``, computed exactly: no rounding, whatever the weights' magnitudes):

    1. An epoch has ``length`` draws; by default ``floor(min_s n_s / p_s)``, the longest epoch in
       which no asset repeats a sample (never more than the assets' samples together).
    2. Asset ``s`` gets ``q_s`` draws per epoch: ``floor(p_s * length)``, the draws left over
       going one each to the largest remainders (ties: the lower asset number), so the shares
       are exact within one draw and the counts sum to ``length``. An asset whose share is
       below one draw in ``length`` may get none.
    3. The order of the assets in the epoch is a seeded permutation of that multiset
       (:func:`h5forge.read.order.epoch_order` with ``seed`` and the epoch).
    4. Inside an asset, samples are drawn without replacement from a seeded permutation; when
       it is exhausted the asset restarts with a new permutation. Asset ``s`` consumes
       positions ``epoch * q_s ..`` of its stream, so every epoch is computed on its own.

    Everything depends only on ``(sizes, weights, length, seed, epoch)``. Each iteration uses
    :attr:`epoch` and then advances it by one; :meth:`set_epoch` chooses the next one. The
    schedule is not split across DDP ranks: every rank would draw all of it.

    Args:
        dataset: the multi-asset dataset.
        weights: one weight per asset, each a finite number in ``(0, MAX_WEIGHT]`` (the largest
            float); default the sources' own (the asset list's ``weight``).
        length: draws per epoch, an int in ``1..MAX_COUNT`` (2**62; an epoch's schedule holds
            ``length`` int64 indices in memory); default as in rule 1.
        seed: the seed of the schedule, any int >= 0. Epochs (:meth:`set_epoch`) are any
            int >= 0 too.

    Raises:
        ValueError: a weight, length or seed out of range (the message names it, its value and
            the range), or an asset with no sample.
    """

    def __init__(
        self,
        dataset: H5MultiDataset,
        *,
        weights: Sequence[float] | None = None,
        length: int | None = None,
        seed: int = 0,
    ) -> None:
        count = len(dataset.datasets)
        w = _check_weights(
            [s.weight for s in dataset.sources] if weights is None else weights, count
        )
        seed = check_int("seed", seed, 0)
        self.members = [dataset.indices_of(a) for a in range(count)]
        sizes = [len(m) for m in self.members]
        if 0 in sizes:
            empty = sizes.index(0)
            raise ValueError(
                f"asset {empty} ({dataset.datasets[empty].url}) has no sample to mix; "
                "drop it from the sources"
            )
        nums, total = _exact(w)
        if length is None:  # floor(min n_s / p_s), exactly: at most sum(n_s)
            length = min(n * total // k for n, k in zip(sizes, nums, strict=True))
        length = check_int("length", length, 1, MAX_COUNT)
        # floor(p_s * length) and its remainder, exactly (over the common ``total``).
        shares = [divmod(k * length, total) for k in nums]
        quota = [q for q, _ in shares]
        left = length - sum(quota)  # 0 <= left < S: each remainder is below one draw
        for s in sorted(range(count), key=lambda s: -shares[s][1])[:left]:  # stable: ties low
            quota[s] += 1
        self.weights, self.length, self.seed = w, length, seed
        self.quota = np.array(quota, dtype=np.int64)
        self.epoch = 0

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration."""
        self.epoch = check_int("epoch", epoch, 0)

    def schedule(self, epoch: int) -> np.ndarray:
        """The dataset indices of ``epoch``, in order (an int64 array of ``length``)."""
        which = np.repeat(np.arange(len(self.quota)), self.quota)
        which = which[epoch_order(self.length, seed=self.seed, epoch=epoch)]
        out = np.empty(self.length, dtype=np.int64)
        for s, q in enumerate(self.quota.tolist()):
            members = self.members[s]
            draws = _stream(len(members), epoch * q, q, [self.seed, 1, s])
            out[which == s] = members[draws]
        return out

    def __iter__(self) -> Iterator[int]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter(self.schedule(epoch).tolist())

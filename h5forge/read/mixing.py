"""Which samples of several assets are read: a seeded subset, and mixing in fixed proportions.

:func:`select_subset` picks the subset of an :class:`~h5forge.read.multi.H5MultiDataset`.
:class:`MixingSampler` yields indices of an :class:`~h5forge.read.multi.H5MultiDataset` so that
each epoch draws every asset its share of the time (the exact rule is in its docstring). It
depends only on the assets' sizes, the weights, the epoch length, the seed and the epoch, so
every process of a job computes the same sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
from torch.utils.data import Sampler

from h5forge.read.order import epoch_order

if TYPE_CHECKING:
    from h5forge.read.multi import H5MultiDataset

__all__ = ["MixingSampler", "select_subset"]


def select_subset(subset: Sequence[int] | float, total: int, *, seed: int) -> np.ndarray:
    """Indices (int64) of a subset of ``range(total)``: ``subset`` itself when it is a list
    (its order kept, repeats allowed), else that fraction in (0, 1] of the indices, drawn with
    ``seed`` and sorted.

    Raises:
        ValueError: a fraction outside (0, 1] or selecting nothing, a list that is not flat
            integers, or an index outside ``range(total)``.
    """
    if isinstance(subset, float):
        k = round(subset * total)
        if not 0.0 < subset <= 1.0 or k == 0:
            raise ValueError(f"subset={subset!r} of {total} samples: give a fraction in (0, 1]")
        rng = np.random.default_rng(seed)
        return np.sort(rng.choice(total, size=k, replace=False)).astype(np.int64)
    if isinstance(subset, (str, bytes)) or not isinstance(subset, Sequence | np.ndarray):
        raise ValueError(
            f"subset must be None, a fraction or a list of indices, not {subset!r:.80}"
        )
    picks = np.asarray(subset)
    if picks.ndim != 1 or (picks.size and picks.dtype.kind not in "iu"):
        raise ValueError(f"subset must be a flat list of integer indices, not {subset!r:.80}")
    picks = picks.astype(np.int64)
    outside = (picks < 0) | (picks >= total)
    if outside.any():
        bad = int(picks[np.flatnonzero(outside)[0]])
        raise ValueError(f"subset index {bad} out of range for {total} samples (0..{total - 1})")
    return picks


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
    (``p_s = w_s / sum(w)``):

    1. An epoch has ``length`` draws; by default ``floor(min_s n_s / p_s)``, the longest epoch in
       which no asset repeats a sample.
    2. Asset ``s`` gets ``q_s`` draws per epoch: ``floor(p_s * length)``, the draws left over
       going one each to the largest remainders (ties: the lower asset number), so the shares
       are exact within one draw and the counts sum to ``length``.
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
        weights: one weight (> 0) per asset; default the sources' own (the asset list's ``weight``).
        length: draws per epoch (>= 1); default as in rule 1.
        seed: the seed of the schedule (>= 0).

    Raises:
        ValueError: a weight, length or seed out of range, or an asset with no sample.
    """

    def __init__(
        self,
        dataset: H5MultiDataset,
        *,
        weights: Sequence[float] | None = None,
        length: int | None = None,
        seed: int = 0,
    ) -> None:
        w = [s.weight for s in dataset.sources] if weights is None else list(weights)
        if len(w) != len(dataset.datasets) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
            for x in w
        ):
            raise ValueError(
                f"weights={w!r:.120} must be {len(dataset.datasets)} finite numbers > 0"
            )
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an int >= 0")
        self.members = [dataset.indices_of(a) for a in range(len(dataset.datasets))]
        sizes = np.array([len(m) for m in self.members], dtype=np.int64)
        if (sizes == 0).any():
            empty = int(np.flatnonzero(sizes == 0)[0])
            raise ValueError(
                f"asset {empty} ({dataset.datasets[empty].url}) has no sample to mix; "
                "drop it from the sources"
            )
        p = np.asarray(w, dtype=np.float64) / sum(w)
        if length is None:
            length = int(math.floor(float(np.min(sizes / p)) + 1e-9))
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length={length!r} must be an int >= 1")
        quota = np.floor(p * length).astype(np.int64)
        left = length - int(quota.sum())
        quota[np.argsort(-(p * length - quota), kind="stable")[:left]] += 1
        self.weights, self.length, self.seed, self.quota = w, length, seed, quota
        self.epoch = 0

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        self.epoch = epoch

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

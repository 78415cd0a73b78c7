"""What a pack wrote: :class:`PackResult`, returned by :func:`h5forge.pack.writer.pack`."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PackResult"]


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote.

    Attributes:
        path: the sealed file.
        counts: ``split -> class name -> number of samples`` ('' is the split of unsplit data).
        quarantined: ``(relative path, reason)`` of every input that was not packed.
        seconds: wall time of the whole pack, verification included.
        reused, reuse_mismatched: samples taken from ``reuse``; those failing their digest.
        target_stats: per target column, its counts (:mod:`h5forge.targets.stats`).
    """

    path: str
    num_samples: int
    num_quarantined: int
    num_classes: int
    classes: tuple[str, ...]
    quarantined: tuple[tuple[str, str], ...]
    bytes: int
    seconds: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    reused: int = 0
    reuse_mismatched: int = 0
    target_stats: dict[str, dict[str, object]] = field(default_factory=dict)

"""Per-column counts of the target values a pack stores, for its build report.

:class:`TargetStats` sees every packed sample once, in the writer's process: its raw values
(as the catalog gives them) and what was stored (after the geometry), and sums per column:

=============  ==============================================================================
kind           :meth:`TargetStats.as_dict` entry
=============  ==============================================================================
``boxes``      ``boxes`` (stored), ``per_image_mean``, ``per_image_max``, ``dropped`` (lost all
               area to the crop), ``per_class`` (class name -> stored boxes)
``mask``       ``pixels`` (class id -> pixels, the bincount of every mask), ``images`` (class
               id -> masks holding it)
``multilabel`` ``per_class`` (class name -> samples), ``empty`` (samples with no class)
``text``       ``mean_bytes``, ``max_bytes``
``number``     ``min``, ``max``, ``mean``
=============  ==============================================================================

Every entry also has ``samples``; the values are JSON-able (str keys, ints and floats; a
statistic of no sample is None).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from h5forge.targets.schema import Column
from h5forge.targets.store import StoredTargets, decode_value

__all__ = ["TargetStats"]


class TargetStats:
    """Sums of the stored target values of ``schema``'s columns, one sample at a time."""

    def __init__(self, schema: Sequence[Column]) -> None:
        self.schema = tuple(schema)
        self.samples = 0
        self._counts = [np.zeros(max(1, len(c.classes)), np.int64) for c in self.schema]
        self._pixels = [np.zeros(256, np.int64) for _ in self.schema]
        self._images = [np.zeros(256, np.int64) for _ in self.schema]
        self._total = [0.0] * len(self.schema)  # boxes, text bytes, number sum, empty labels
        self._max: list[float | None] = [None] * len(self.schema)
        self._min: list[float | None] = [None] * len(self.schema)
        self._dropped = [0] * len(self.schema)

    def add(self, raw: Sequence[object], stored: StoredTargets) -> None:
        """One packed sample: its raw values (schema order; ``()`` for values carried as
        stored from another file) and what was stored."""
        self.samples += 1
        for k, (c, blob, shape) in enumerate(
            zip(self.schema, stored.data, stored.shapes, strict=True)
        ):
            if c.kind == "boxes":
                classes = np.frombuffer(blob, np.float32).reshape(-1, 6)[:, 4].astype(np.int64)
                self._counts[k] += np.bincount(classes, minlength=len(self._counts[k]))
                self._total[k] += len(classes)
                if raw:  # carried values (no raw ones) were stored as they were: none dropped
                    self._dropped[k] += len(raw[k]) - len(classes)  # type: ignore[arg-type]
                self._extremes(k, len(classes))
            elif c.kind == "mask":
                made = stored.histograms[k] if len(stored.histograms) > k else None
                hist = made if made is not None else _histogram(c, blob, shape)
                self._pixels[k] += hist
                self._images[k] += hist > 0
            elif c.kind == "multilabel":
                labels = np.frombuffer(blob, np.int32)
                self._counts[k][labels] += 1
                self._total[k] += not len(labels)
            elif c.kind == "text":
                self._total[k] += len(blob)
                self._extremes(k, len(blob))
            else:
                value = decode_value(c, blob, None)
                self._total[k] += value
                self._extremes(k, value)

    def _extremes(self, k: int, value: float) -> None:
        low, high = self._min[k], self._max[k]
        self._min[k] = value if low is None else min(low, value)
        self._max[k] = value if high is None else max(high, value)

    def as_dict(self) -> dict[str, dict[str, object]]:
        """Column name -> its statistics (see the module's table)."""
        n = self.samples
        out: dict[str, dict[str, object]] = {}
        for k, c in enumerate(self.schema):
            entry: dict[str, object] = {"samples": n}
            total = self._total[k]
            if c.kind == "boxes":
                entry |= {
                    "boxes": int(total),
                    "per_image_mean": total / n if n else None,
                    "per_image_max": self._max[k],
                    "dropped": self._dropped[k],
                    "per_class": _named(self._counts[k], c.classes),
                }
            elif c.kind == "mask":
                entry |= {"pixels": _named(self._pixels[k]), "images": _named(self._images[k])}
            elif c.kind == "multilabel":
                entry |= {"per_class": _named(self._counts[k], c.classes), "empty": int(total)}
            elif c.kind == "text":
                entry |= {"mean_bytes": total / n if n else None, "max_bytes": self._max[k]}
            else:
                entry |= {
                    "min": self._min[k],
                    "max": self._max[k],
                    "mean": total / n if n else None,
                }
            out[c.name] = entry
        return out


def _named(counts: np.ndarray, names: Sequence[str] = ()) -> dict[str, int]:
    """Non-zero counts by class name (or by id, as a string, where there are no names)."""
    found = np.flatnonzero(counts).tolist()
    return {(names[i] if names else str(i)): int(counts[i]) for i in found}


def _histogram(c: Column, blob: bytes, shape: object) -> np.ndarray:
    """A mask's pixels per class id, decoded from its stored bytes (when the worker sent no
    histogram)."""
    mask = decode_value(c, blob, shape)  # type: ignore[arg-type]
    return np.bincount(mask.ravel(), minlength=256)

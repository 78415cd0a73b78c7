"""``target=`` of :class:`~h5forge.read.dataset.H5ImageDataset`: what a sample comes with, as
torch values (torchvision ``tv_tensors`` where they apply), and how a batch of them is collated.

``target`` is ``"class"`` (the default: the integer label, as in format version 1), a column's
name, a kind word (``"multilabel"``, ``"boxes"``, ``"mask"``, ``"text"``, ``"number"``: the one
column of that kind; a name wins over a kind word), or a list of those, which gives a dict
``{key: value}`` keyed by ``"class"`` and the column names. What each gives:

==============  ===============================================================================
``class``       ``int``, the label
``multilabel``  ``(len(classes),) float32`` multi-hot (``multilabel="multihot"``, the default;
                what ``BCEWithLogitsLoss`` takes) or ``(k,) int64`` sorted class indices
                (``multilabel="indices"``)
``boxes``       ``{"boxes": (M, 4) float32 XYXY, absolute pixels of the stored image,
                "labels": (M,) int64}`` (the dict torchvision's detection models train on),
                with ``"iscrowd": (M,) uint8`` too when ``iscrowd=True`` (COCO evaluation;
                like the keys of torchvision's ``wrap_dataset_for_transforms_v2``, whose
                default gives boxes and labels and the other keys on request)
``mask``        ``(H, W) uint8`` class ids, the image's size
``text``        ``str``
``number``      ``int`` or ``float`` (the column's dtype)
==============  ===============================================================================

With torchvision importable, ``boxes`` is a ``tv_tensors.BoundingBoxes(format="XYXY",
canvas_size=(H, W))``, a mask a ``tv_tensors.Mask``, and, when a boxes or mask target is asked
for, the image a ``tv_tensors.Image`` (C x H x W), so ``torchvision.transforms.v2`` transforms
``(image, target)`` as is (flips, crops, ``SanitizeBoundingBoxes``). Without torchvision they
are plain tensors of the same shapes.

Batches (``loader()``, ``read_batch``): fixed-size values stack — ``class`` and ``number`` as a
``(B,)`` tensor (int64, or float64 for a float column), multi-hot ``(B, C)``, masks of one size
``(B, H, W)`` (a plain tensor, like the batch's images); variable-length ones are lists of B —
boxes dicts (each a ``BoundingBoxes`` with torchvision), index lists, text, masks of differing
sizes. With a list ``target``, a batch's second item is a dict of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from h5forge.read.collate import check_one_size
from h5forge.read.ragged import Ragged, unpack
from h5forge.read.tv import tv_tensors
from h5forge.targets.schema import KINDS, MAX_COLUMNS, Column

__all__ = ["CLASS", "MULTILABEL_FORMS", "Selection", "select"]

CLASS = "class"
MULTILABEL_FORMS = ("multihot", "indices")


@dataclass(frozen=True)
class Selection:
    """What ``target=`` resolved to in one file.

    Attributes:
        keys: ``"class"`` or column names, in the order asked.
        columns: the columns to read (every key but ``"class"``), schema objects.
        as_dict: a list was asked for: each target is a dict keyed by ``keys``.
        multilabel: ``"multihot"`` or ``"indices"``.
        iscrowd: boxes dicts hold ``"iscrowd"`` too.
    """

    keys: tuple[str, ...]
    columns: tuple[Column, ...]
    as_dict: bool
    multilabel: str = "multihot"
    iscrowd: bool = False

    @property
    def spatial(self) -> bool:
        """A boxes or mask column is asked for (the image comes as ``tv_tensors.Image``)."""
        return any(c.kind in ("boxes", "mask") for c in self.columns)

    def _kind(self, key: str) -> str:
        if key == CLASS:
            return CLASS
        kind: str = next(c.kind for c in self.columns if c.name == key)
        return f"multilabel:{self.multilabel}" if kind == "multilabel" else kind

    @property
    def _boxes(self) -> str:
        """The :class:`~h5forge.read.ragged.Ragged` kind of this selection's boxes."""
        return "boxes+iscrowd" if self.iscrowd else "boxes"

    def image(self, image: torch.Tensor) -> Any:
        """The image as this selection hands it out."""
        tv = tv_tensors() if self.spatial else None
        return image if tv is None else tv.Image(image)

    def target(self, label: int, values: dict[str, Any], canvas: tuple[int, int]) -> Any:
        """One sample's target from its label and its columns' decoded values
        (:meth:`h5forge.read.target_reads.TargetReads.values`); ``canvas`` its image's (H, W)."""
        out = {k: label if k == CLASS else self._value(k, values[k], canvas) for k in self.keys}
        return out if self.as_dict else out[self.keys[0]]

    def _value(self, key: str, value: Any, canvas: tuple[int, int]) -> Any:
        kind = self._kind(key)
        tv = tv_tensors()
        if kind == "multilabel:multihot":
            size = len(next(c for c in self.columns if c.name == key).classes)
            hot = torch.zeros(size, dtype=torch.float32)
            hot[torch.from_numpy(value)] = 1.0
            return hot
        if kind == "multilabel:indices":
            return torch.from_numpy(value)
        if kind == "boxes":  # a batch of one
            return unpack(self._boxes, torch.from_numpy(value), [len(value)], [canvas])[0]
        if kind == "mask":
            mask = torch.from_numpy(value)
            return mask if tv is None else tv.Mask(mask)
        return value  # text: str; number: int or float

    def batch(self, items: Sequence[tuple[Any, Any]], *, url: str) -> tuple[Any, Any]:
        """``(images, targets)`` of samples ``(image, target)``: the images stacked (plain
        tensors; of one size, else a ValueError saying what to do), the targets collated.
        """
        from torch.utils.data import default_collate

        images = [image for image, _ in items]
        check_one_size(images, url=url)
        if all(isinstance(image, torch.Tensor) for image in images):
            images = [image.as_subclass(torch.Tensor) for image in images]
        return default_collate(images), self.collate([t for _, t in items])

    def from_columns(
        self,
        labels: np.ndarray,
        cols: dict[str, Any],
        canvas: list[tuple[int, int]],
        *,
        in_worker: bool,
    ) -> Any:
        """A batch of targets, as :meth:`collate` would make it, from the columns in one
        piece each (:meth:`h5forge.read.target_reads.TargetReads.batch`): the batch's values
        are converted with a few whole-batch operations instead of one per sample. Inside a
        worker, boxes and index lists are :class:`~h5forge.read.ragged.Ragged` (one tensor
        to send; a list again on arrival)."""
        out: dict[str, Any] = {}
        for key in self.keys:
            kind = self._kind(key)
            value: Any = cols.get(key)
            if kind == CLASS:
                out[key] = torch.from_numpy(np.asarray(labels, np.int64))
            elif kind == "number":
                out[key] = torch.from_numpy(value)
            elif kind == "multilabel:multihot":
                flat, counts = value
                size = len(next(c for c in self.columns if c.name == key).classes)
                hot = torch.zeros(len(counts), size, dtype=torch.float32)
                which = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
                hot[which, flat.to(torch.int64)] = 1.0
                out[key] = hot
            elif kind in ("multilabel:indices", "boxes"):
                rows, counts = value  # a region of the batch's memory
                name = self._boxes if kind == "boxes" else "indices"
                out[key] = (
                    Ragged(name, rows, counts, canvas)
                    if in_worker
                    else unpack(name, rows, counts, canvas)
                )
            elif kind == "mask" and isinstance(value, torch.Tensor):
                out[key] = value  # read straight into the batch's (B, H, W) tensor
            elif kind == "mask":
                out[key] = _batch(kind, [torch.from_numpy(v) for v in value])
            else:
                out[key] = value  # text: a list of str
        return out if self.as_dict else out[self.keys[0]]

    def collate(self, targets: Sequence[Any]) -> Any:
        """A batch of targets (see the module docstring)."""
        if not self.as_dict:
            return _batch(self._kind(self.keys[0]), list(targets))
        return {k: _batch(self._kind(k), [t[k] for t in targets]) for k in self.keys}


def _batch(kind: str, values: list[Any]) -> Any:
    from torch.utils.data import default_collate

    if kind in (CLASS, "number", "multilabel:multihot"):
        try:
            return default_collate(values)
        except (TypeError, RuntimeError):  # a target_transform made them of differing shapes
            return values
    tensors = all(isinstance(v, torch.Tensor) for v in values)
    if kind == "mask" and tensors and len({tuple(v.shape) for v in values}) == 1:
        # in shared memory inside a worker; a plain tensor, as the batch's images
        return default_collate([v.as_subclass(torch.Tensor) for v in values])
    return values


def _describe(schema: Sequence[Column]) -> str:
    return ", ".join(f"{c.name!r} ({c.kind})" for c in schema)


def select(
    target: object,
    schema: Sequence[Column],
    *,
    where: str,
    multilabel: str = "multihot",
    iscrowd: bool = False,
) -> Selection:
    """Resolve ``target`` (see the module docstring) against a file's schema.

    Raises:
        ValueError: ``target`` is not a word, a name or a list of them, names no column of
            the file (the message lists the file's columns), names a kind with no or several
            columns, or repeats one; a target other than ``"class"`` asked of a file without
            target columns; ``multilabel`` or ``iscrowd`` of another value or type.
    """
    if multilabel not in MULTILABEL_FORMS:
        raise ValueError(f"multilabel={multilabel!r} must be one of {MULTILABEL_FORMS}")
    if not isinstance(iscrowd, bool):
        raise ValueError(f"iscrowd={iscrowd!r:.100} must be True or False")
    as_dict = isinstance(target, (list, tuple))
    asked = list(target) if isinstance(target, (list, tuple)) else [target]
    if not asked or len(asked) > MAX_COLUMNS + 1 or any(not isinstance(a, str) for a in asked):
        raise ValueError(
            f"target={target!r:.200} must be 'class', a column name, a kind "
            f"({', '.join(KINDS)}) or a non-empty list of those"
        )
    by_name = {c.name: c for c in schema}
    keys: list[str] = []
    for a in asked:
        if a == CLASS:
            keys.append(CLASS)
            continue
        if not schema:
            raise ValueError(
                f"{where}: this asset has no target columns (format version 1), so "
                f"target={a!r} cannot be read; only target='class' can. Pack it from a source "
                "with target columns (a sample listing with extra columns, COCO instances, or "
                "images/ + masks/ folders) to read boxes, masks, labels lists, text or numbers"
            )
        if a in by_name:
            keys.append(a)
            continue
        of_kind = [c for c in schema if c.kind == a]
        if len(of_kind) != 1:
            why = (
                f"it has {len(of_kind)} {a} columns, name one"
                if of_kind
                else f"{a!r} is no column name or kind there"
            )
            raise ValueError(
                f"{where}: target={a!r}: {why}; its columns are {_describe(schema)}; give "
                "'class', a column name or a kind with one column"
            )
        keys.append(of_kind[0].name)
    if len(set(keys)) != len(keys):
        raise ValueError(f"target={target!r}: asks for a column twice (as {keys})")
    columns = tuple(by_name[k] for k in keys if k != CLASS)
    return Selection(tuple(keys), columns, as_dict, multilabel, iscrowd)

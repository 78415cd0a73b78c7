"""A paired-folder segmentation layout: ``root/images/...`` and ``root/<masks>/...``, untrusted.

The image ``images/a/b.jpg`` pairs with the mask of the same relative stem, ``<masks>/a/b.png``;
when several masks share the stem, the ``.png`` one is taken, else the first by name (the
others are counted, ``mask-duplicate-stem``). Both folders are walked like an ImageFolder's class
folder (:func:`h5forge.discover.folder.walk_images`: image extensions only, links followed only
inside ``root``, hidden entries, special files and too-deep folders left out and counted).
Splits: when every image lies below a first-level folder named as a split (``images/train/...``,
``images/val/...``), that folder is the sample's split (the masks mirror it:
``masks/train/...``). One target column, ``mask`` (kind mask); every sample is of the class
:data:`~h5forge.discover.source_samples.UNLABELLED`. An image without a mask is quarantined
(``no mask for ...``); a mask without an image is counted (``mask-without-image``).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from h5forge.discover.folder import SPLIT_NAMES, Found, walk_images
from h5forge.discover.rows import check_path
from h5forge.discover.source_samples import UNLABELLED, SourceSamples
from h5forge.errors import EmptyDatasetError
from h5forge.paths import is_within, resolve
from h5forge.targets.schema import Column
from h5forge.text import printable

__all__ = ["IMAGES_FOLDER", "MASK_COLUMN", "paired_samples"]

#: The folder below the root that holds the images.
IMAGES_FOLDER = "images"
#: The one target column of a paired folder.
MASK_COLUMN = Column("mask", "mask")


def paired_samples(root: Path, masks: str) -> SourceSamples:
    """The samples of ``root/images`` paired with their masks in ``root/<masks>``.

    Raises:
        FileNotFoundError: ``root/images`` or the masks folder does not exist.
        ValueError: ``masks`` leaves the root, is ``images``, or a folder's real path (links
            resolved) is outside the root.
        EmptyDatasetError: no image, or no image with a mask.
    """
    where = f"paired folder '{printable(root)}'"
    masks = check_path(f"{where}: masks=", masks, folder="the dataset root")
    if masks == IMAGES_FOLDER or masks == ".":
        raise ValueError(f"{where}: masks={masks!r} must name a folder other than images/")
    root_real = resolve(root)
    images_dir, masks_dir = root / IMAGES_FOLDER, root / masks
    for folder in (images_dir, masks_dir):
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{where}: no folder '{printable(folder)}'; expected root/{IMAGES_FOLDER}/... "
                f"and root/{masks}/... with matching relative paths"
            )
        if not is_within(root_real, resolve(folder)):
            raise ValueError(
                f"{where}: '{printable(folder)}' is a link to '{printable(resolve(folder))}', "
                "outside the root; copy the files in"
            )
    skipped: Counter[str] = Counter()
    images = walk_images(images_dir, skipped, root_real)
    by_stem = _masks_by_stem(walk_images(masks_dir, skipped, root_real), skipped)
    if not images:
        raise EmptyDatasetError(f"{where}: '{printable(images_dir)}' holds no image file")
    split_mode = all(rel.partition("/")[0] in SPLIT_NAMES and "/" in rel for rel in images)
    out = SourceSamples([], (UNLABELLED,), (), skipped, schema=(MASK_COLUMN,))
    used: set[str] = set()
    for rel in images:
        stem = os.path.splitext(rel)[0]
        relpath = f"{IMAGES_FOLDER}/{rel}"
        mask = by_stem.get(stem)
        if mask is None:
            out.rejected.append(
                (relpath, f"no mask for {relpath}: expected {masks}/{stem}.png (same stem)")
            )
            continue
        used.add(mask)
        split = rel.partition("/")[0] if split_mode else ""
        found: Found = (split, UNLABELLED, relpath, str(images_dir / rel))
        out.found.append(found)
        out.targets[relpath] = (str(masks_dir / mask),)
    unused = len(by_stem) - len(used)
    if unused:
        skipped["mask-without-image"] += unused
    if not out.found:
        raise EmptyDatasetError(f"{where}: no image has a mask; the first: {out.rejected[0][1]}")
    out.splits = tuple(s for s in SPLIT_NAMES if any(f[0] == s for f in out.found))
    return out


def _masks_by_stem(masks: list[str], skipped: Counter[str]) -> dict[str, str]:
    """Relative stem -> the mask file for it (``.png`` first, else the first by name)."""
    by_stem: dict[str, str] = {}
    for rel in masks:  # sorted by walk_images
        stem = os.path.splitext(rel)[0]
        have = by_stem.get(stem)
        if have is None:
            by_stem[stem] = rel
            continue
        skipped["mask-duplicate-stem"] += 1
        if rel.lower().endswith(".png") and not have.lower().endswith(".png"):
            by_stem[stem] = rel
    return by_stem

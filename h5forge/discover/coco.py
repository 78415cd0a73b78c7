"""COCO instances JSON: the images it lists, each with its boxes, read as untrusted input.

``discover(images_root, coco="annotations/instances_train.json")``: every entry of ``images``
(``id``, ``file_name`` relative to ``images_root``, checked like a listing path) is a sample of
the class :data:`~h5forge.discover.source_samples.UNLABELLED` with one target column ``boxes`` (kind
boxes): each annotation's ``bbox`` ``[x, y, w, h]`` becomes XYXY ``(x, y, x + w, y + h)``, its
class the index of its category's name among the sorted category names, ``iscrowd`` kept (0 when
absent). An image without annotations has no boxes. With ``masks`` (``coco_masks=True``), a
second column ``segmentation`` (kind mask) is drawn from the annotations' polygons and RLE
(:mod:`h5forge.discover.coco_masks`); without, segmentations are ignored.

Quarantined (:attr:`~h5forge.discover.catalog.Catalog.rejected`), the rest kept: an image whose
file is missing (``missing image: ...``), or one of whose annotations names an unknown category,
has a malformed ``bbox`` or breaks the boxes rule (NaN, negative size: the
:func:`~h5forge.targets.schema.check_value` reason). An annotation of an image id the file does
not list is counted (``annotation-unknown-image``). Refused with a ``ValueError`` naming the
file: not JSON, not an object with the lists ``images`` and ``categories``, an entry of the wrong
shape, a repeated id, name or file, a path that leaves ``images_root`` (links included) or is
not a regular file, or a bound passed: :data:`h5forge.location.MAX_COCO_BYTES`,
:data:`MAX_COCO_IMAGES`, :data:`MAX_COCO_ANNOTATIONS`, ``MAX_CLASSES`` categories.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from h5forge.discover.coco_masks import CROWD, MAX_MASK_CLASSES, WHERE, drawn, shape_of
from h5forge.discover.listing import MAX_LABEL_CHARS, MAX_LISTING_ROWS, check_listing_file
from h5forge.discover.rows import check_file, check_path
from h5forge.discover.source_samples import UNLABELLED, SourceSamples
from h5forge.documents import parse_json
from h5forge.errors import EmptyDatasetError
from h5forge.files import open_regular
from h5forge.location import MAX_COCO_BYTES
from h5forge.paths import resolve
from h5forge.targets.schema import MAX_CLASSES, Column, TargetError, check_value
from h5forge.targets.shapes import Drawn, Shape
from h5forge.text import printable

__all__ = ["MAX_COCO_ANNOTATIONS", "MAX_COCO_IMAGES", "coco_samples"]

# COCO 2017's train instances are 448 MB, 118k images and 860k annotations.
MAX_COCO_IMAGES = MAX_LISTING_ROWS
MAX_COCO_ANNOTATIONS = 5 * MAX_LISTING_ROWS

Box = tuple[object, ...]
_ROOT = "the images root"


def coco_samples(root: Path, path: Path, *, masks: bool = False) -> SourceSamples:
    """The samples of the COCO instances file ``path``, images relative to ``root``; with
    ``masks``, each with its segmentation mask too.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: see the module docstring; with ``masks``, more than
            :data:`~h5forge.discover.coco_masks.MAX_MASK_CLASSES` categories.
        EmptyDatasetError: no image is left.
    """
    shown = printable(path)
    data = _load(path, shown)
    classes, category = _categories(data["categories"], shown)
    if masks and len(classes) > MAX_MASK_CLASSES:
        raise ValueError(
            f"COCO '{shown}': {len(classes):,} categories, more than the {MAX_MASK_CLASSES} a "
            "uint8 segmentation mask can tell apart (1..254; 255 is crowd); pack without "
            "coco_masks, or merge categories"
        )
    column = Column("boxes", "boxes", classes=classes)
    schema = (column, Column("segmentation", "mask")) if masks else (column,)
    images = data["images"]
    if len(images) > MAX_COCO_IMAGES:
        raise ValueError(f"COCO '{shown}': {len(images):,} images, over {MAX_COCO_IMAGES:,}")
    ids: dict[int, int] = {}
    for i, image in enumerate(images):
        if (
            not isinstance(image, dict)
            or not _is_int(image.get("id"))
            or not isinstance(image.get("file_name"), str)
        ):
            raise ValueError(
                f"COCO '{shown}': images[{i}] is {printable(repr(image), limit=80)}, expected an "
                "object with an integer 'id' and a string 'file_name'"
            )
        if image["id"] in ids:
            raise ValueError(f"COCO '{shown}': images[{i}] repeats id {image['id']}")
        ids[image["id"]] = i
    sizes = _sizes(images) if masks else None
    boxes, shapes, problems, unknown = _annotations(
        data.get("annotations", []), shown, ids, category, sizes
    )
    out = SourceSamples([], (UNLABELLED,), (), schema=schema)
    if unknown:
        out.skipped["annotation-unknown-image"] = unknown
    root_real = resolve(root)
    folders: dict[str, str] = {}
    seen: dict[str, int] = {}
    for i, image in enumerate(images):
        rel = image["file_name"]
        where = f"COCO '{shown}': images[{i}]"
        norm = check_path(where, rel, folder=_ROOT)
        if norm in seen:
            raise ValueError(f"{where}: file '{printable(rel)}' is already images[{seen[norm]}]")
        seen[norm] = i
        full = root / norm
        try:
            check_file(where, rel, norm, full, root_real, folders, folder=_ROOT)
        except FileNotFoundError as e:
            out.rejected.append((norm, f"missing image: {e}"))
            continue
        try:
            if i in problems:
                raise TargetError(problems[i])
            value = check_value(column, boxes.get(i, []))
            values = (value,) if sizes is None else (value, _mask(sizes, i, shapes))
        except TargetError as e:
            out.rejected.append((norm, f"{e} ({where})"))
            continue
        out.found.append(("", UNLABELLED, norm, str(full)))
        out.targets[norm] = values
    if not out.found:
        first = f"; the first quarantined: {out.rejected[0][1]}" if out.rejected else ""
        raise EmptyDatasetError(f"COCO '{shown}' leaves no image{first}")
    return out


def _load(path: Path, shown: str) -> dict[str, Any]:
    check_listing_file(path, f"COCO file '{shown}'", MAX_COCO_BYTES, "split it")
    with os.fdopen(open_regular(path, "COCO file"), "rb") as f:  # never blocks on a FIFO
        data = parse_json(f.read(MAX_COCO_BYTES + 1), what="COCO file", name=shown)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("images"), list)
        or not isinstance(data.get("categories"), list)
        or not isinstance(data.get("annotations", []), list)
    ):
        raise ValueError(
            f"COCO file '{shown}' is not COCO instances: expected an object with the lists "
            "'images', 'categories' and 'annotations'"
        )
    return data


def _categories(raw: list[object], shown: str) -> tuple[tuple[str, ...], dict[int, int]]:
    """Sorted category names and category id -> class index."""
    if len(raw) > MAX_CLASSES:
        raise ValueError(f"COCO '{shown}': {len(raw):,} categories, over {MAX_CLASSES:,}")
    names: dict[int, str] = {}
    for j, c in enumerate(raw):
        name = c.get("name") if isinstance(c, dict) else None
        if (
            not isinstance(c, dict)
            or not _is_int(c.get("id"))
            or not isinstance(name, str)
            or not 0 < len(name) <= MAX_LABEL_CHARS
        ):
            raise ValueError(
                f"COCO '{shown}': categories[{j}] is {printable(repr(c), limit=80)}, expected an "
                f"object with an integer 'id' and a 'name' of 1..{MAX_LABEL_CHARS} characters"
            )
        if c["id"] in names:
            raise ValueError(f"COCO '{shown}': categories[{j}] repeats id {c['id']}")
        names[c["id"]] = name
    classes = tuple(sorted(set(names.values())))
    if len(classes) != len(names):
        raise ValueError(f"COCO '{shown}': two categories share a name; names must be distinct")
    index = {name: k for k, name in enumerate(classes)}
    return classes, {cid: index[name] for cid, name in names.items()}


def _sizes(images: list[Any]) -> dict[int, tuple[int, int] | None]:
    """Each image's (width, height) by position; None where the file gives none."""
    out: dict[int, tuple[int, int] | None] = {}
    for i, image in enumerate(images):
        w, h = image.get("width"), image.get("height")
        out[i] = (w, h) if _is_int(w) and _is_int(h) and w > 0 and h > 0 else None
    return out


def _mask(
    sizes: dict[int, tuple[int, int] | None], i: int, shapes: dict[int, list[Shape]]
) -> Drawn:
    size = sizes[i]
    if size is None:
        raise TargetError(f"{WHERE}: the image has no integer width and height, its mask's size")
    return drawn(size, shapes.get(i, []), WHERE)


def _annotations(
    raw: list[object],
    shown: str,
    ids: dict[int, int],
    category: dict[int, int],
    sizes: dict[int, tuple[int, int] | None] | None,
) -> tuple[dict[int, list[Box]], dict[int, list[Shape]], dict[int, str], int]:
    """Boxes and (with ``sizes``, the images' sizes) mask shapes by image position, the first
    problem by image position, annotations of no image."""
    if len(raw) > MAX_COCO_ANNOTATIONS:
        raise ValueError(f"COCO '{shown}': {len(raw):,} annotations, over {MAX_COCO_ANNOTATIONS:,}")
    boxes: dict[int, list[Box]] = {}
    shapes: dict[int, list[Shape]] = {}
    problems: dict[int, str] = {}
    unknown = 0
    for j, a in enumerate(raw):
        if not isinstance(a, dict) or not _is_int(a.get("image_id")):
            raise ValueError(
                f"COCO '{shown}': annotations[{j}] is {printable(repr(a), limit=80)}, expected an "
                "object with an integer 'image_id'"
            )
        i = ids.get(a["image_id"])
        if i is None:
            unknown += 1
            continue
        where = f"bad target: column 'boxes': annotations[{j}]"
        bbox, crowd, cid = a.get("bbox"), a.get("iscrowd", 0), a.get("category_id")
        if not _is_int(cid) or cid not in category:
            problems.setdefault(
                i,
                f"{where} has category_id {printable(repr(cid), limit=40)}, "
                "not one of the file's categories",
            )
        elif (
            not isinstance(bbox, list)
            or len(bbox) != 4
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in bbox)
        ):
            problems.setdefault(
                i, f"{where}: bbox {printable(repr(bbox), limit=60)} is not [x, y, w, h]"
            )
        elif crowd not in (0, 1):
            problems.setdefault(i, f"{where}: iscrowd {printable(repr(crowd), limit=20)}, not 0/1")
        else:
            x, y, w, h = bbox
            try:
                corner = (x + w, y + h)
            except OverflowError:  # an integer of hundreds of digits beside a float
                problems.setdefault(i, f"{where}: bbox holds a number too large for a float")
                continue
            boxes.setdefault(i, []).append((x, y, *corner, category[cid], int(crowd)))
            size = None if sizes is None else sizes[i]
            if size is not None:
                value = CROWD if crowd else 1 + category[cid]
                try:
                    shape = shape_of(
                        a.get("segmentation"), value, size, f"{WHERE}: annotations[{j}]"
                    )
                except TargetError as e:
                    problems.setdefault(i, str(e))
                    continue
                if shape is not None:
                    shapes.setdefault(i, []).append(shape)
    return boxes, shapes, problems, unknown


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)

"""Find the samples of a dataset: an ImageFolder tree or a CSV/JSONL listing -> :class:`Catalog`.

ImageFolder: ``root/<class>/<file>``, or ``root/<split>/<class>/<file>`` when every top-level
folder is a split name (``train``, ``val``, ``validation``, ``test``). Files below a class folder
are found recursively. Hidden entries (name starts with ``.``), files without an image extension,
broken links, files outside a class folder, directories already visited below the same class
folder and links to the class folder or a folder above it (symlink loops) are skipped and counted
in :attr:`Catalog.skipped`. Symlinks to files and folders are followed while they stay inside
the root: a link whose real target is outside it is skipped (``link-outside-root``), so a tree
from someone else cannot make a pack read ``/etc`` or a home folder. Folders more than
:data:`MAX_DEPTH` levels below a class folder are skipped (``folder-too-deep``), as are paths
the kernel cannot name (``path-too-long``); the walk (:mod:`h5forge.discover.folder`) is
iterative, so depth never exhausts the stack.

Listing: see :func:`discover`; reading its rows is :mod:`h5forge.discover.listing`, checking
them :mod:`h5forge.discover.rows`, its target columns :mod:`h5forge.discover.columns`. COCO
instances: :mod:`h5forge.discover.coco`; a paired images/masks folder:
:mod:`h5forge.discover.paired`. Rows whose targets break their column's rule are quarantined
(:attr:`Catalog.rejected`), not errors.
Every error names the listing and the physical line, and names from it are shown escaped.

Order is deterministic: by split (in ``SPLIT_NAMES`` order), then class, then relpath (code
point order); labels index the sorted class names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from h5forge.discover.coco import coco_samples
from h5forge.discover.columns import ColumnSpec, RowTargets, listing_schema
from h5forge.discover.folder import IMAGE_EXTENSIONS, SPLIT_NAMES, Found, scan_folder
from h5forge.discover.listing import JSONL_SUFFIXES, read_rows
from h5forge.discover.paired import paired_samples
from h5forge.discover.rows import check_file, check_label_range, check_path
from h5forge.discover.source_samples import UNLABELLED, SourceSamples
from h5forge.errors import EmptyDatasetError
from h5forge.paths import MAX_DEPTH, resolve
from h5forge.targets.schema import Schema, TargetError
from h5forge.text import printable

__all__ = [
    "IMAGE_EXTENSIONS",
    "MAX_DEPTH",
    "SPLIT_NAMES",
    "UNLABELLED",
    "Catalog",
    "Sample",
    "discover",
]


@dataclass(frozen=True)
class Sample:
    """One source image.

    Attributes:
        path: absolute local path of the source file.
        relpath: POSIX path relative to the dataset root (what the file records).
        label: class index, ``0..K-1``.
        split: split name, ``""`` when the dataset has no splits.
        targets: the raw target values, one per column of :attr:`Catalog.schema` in its order
            (checked by :func:`h5forge.targets.schema.check_value`); ``()`` without a schema.
    """

    path: str
    relpath: str
    label: int
    split: str
    targets: tuple[object, ...] = ()


@dataclass(frozen=True)
class Catalog:
    """Every sample of a dataset, in a deterministic order.

    Attributes:
        root: absolute dataset root; relpaths are relative to it (the listing's folder for a
            listing).
        samples: sorted by split order, class, relpath.
        classes: class names; label ``i`` is ``classes[i]``.
        splits: split names present, in ``SPLIT_NAMES`` order; ``()`` when there are none.
        skipped: reason -> number of entries left out.
        schema: the target columns every sample carries besides its class
            (:mod:`h5forge.targets`); ``()``: class only.
        rejected: ``(relpath, reason)`` of source entries quarantined while discovering (a bad
            target value, a missing mask): the pack records them with the images it
            quarantines.
    """

    root: str
    samples: tuple[Sample, ...]
    classes: tuple[str, ...]
    splits: tuple[str, ...]
    skipped: dict[str, int]
    schema: Schema = ()
    rejected: tuple[tuple[str, str], ...] = ()

    def counts(self) -> dict[str, dict[str, int]]:
        """``{split: {class: samples}}``; the split is ``""`` when there are none."""
        out: dict[str, dict[str, int]] = {}
        for s in self.samples:
            per_class = out.setdefault(s.split, {})
            per_class[self.classes[s.label]] = per_class.get(self.classes[s.label], 0) + 1
        return out


def discover(
    root: str | os.PathLike[str],
    *,
    listing: str | os.PathLike[str] | None = None,
    coco: str | os.PathLike[str] | None = None,
    masks: str | None = None,
    columns: ColumnSpec | None = None,
    coco_masks: bool = False,
) -> Catalog:
    """Build the catalog of an ImageFolder tree, a listing, a COCO file or a paired folder.

    A listing is CSV with a header ``path,label[,split]`` or JSONL (``.jsonl``/``.ndjson``)
    with objects holding ``path``, ``label`` and optionally ``split``. Every other column is a
    target column (:mod:`h5forge.discover.columns`: given by ``columns=``, else inferred);
    ``label`` may then be left out, and every sample is of the class :data:`UNLABELLED`.
    Paths are POSIX, relative to the listing's folder, and may not leave it, lexically or
    through symbolic links (the real target is checked); each must be a regular file (a FIFO or
    device is refused, never opened). Labels are class names (strings) or class indices: JSON
    integers, or CSV labels that are all decimal digits. Names are sorted to give indices;
    indices ``0..max`` are kept as given and the classes are named ``"0"``, ``"1"``, ...; an
    index must be below ``max(rows, LABEL_FLOOR)``, so the classes made are bounded by the
    listing, never by a label's value. Listing entries are used as listed (no extension
    filter). Bounds: ``h5forge.location.MAX_LISTING_BYTES``; in :mod:`h5forge.discover.listing`
    ``MAX_LISTING_ROWS``, ``MAX_LINE_BYTES`` per physical line, ``csv.field_size_limit()``
    per CSV field, ``MAX_PATH_BYTES`` per path, ``MAX_LABEL_CHARS`` per label. CSV rows must
    have as many fields as the header; text must be UTF-8 (a BOM is allowed) without NUL bytes.

    Args:
        root: the ImageFolder root; with ``listing``, the folder a relative listing path is
            resolved against; with ``coco``, the folder the images' ``file_name`` are relative
            to; with ``masks``, the folder holding ``images/`` and the masks folder.
        listing: path of a CSV or JSONL listing.
        coco: path of a COCO instances JSON (relative to ``root`` or absolute): one ``boxes``
            column (:mod:`h5forge.discover.coco`).
        masks: name of the masks folder beside ``root/images``: one ``mask`` column
            (:mod:`h5forge.discover.paired`).
        columns: a listing's target columns, ``{name: kind or Column}``; None infers them,
            ``{}`` ignores every column but path, label and split.
        coco_masks: with ``coco``, a second column ``segmentation`` (kind mask) drawn from
            the annotations' polygons and RLE (:mod:`h5forge.discover.coco_masks`).

    Returns:
        The catalog.

    Raises:
        FileNotFoundError: ``root``, the listing or a file it lists does not exist.
        NotADirectoryError: ``root`` is not a folder.
        ValueError: mixed split/class top-level folders, a malformed listing line (the
            message names the listing, the line, the value and the rule), a malformed COCO
            file, or two sources given at once.
        EmptyDatasetError: no image at all, or a class folder without an image.
    """
    base = Path(os.path.abspath(root))
    if not base.exists():
        raise FileNotFoundError(f"dataset root {str(base)!r} does not exist")
    if not base.is_dir():
        raise NotADirectoryError(
            f"dataset root {str(base)!r} is not a folder; give the folder "
            "that holds the class (or split) folders"
        )
    given = [
        n for n, v in (("listing", listing), ("coco", coco), ("masks", masks)) if v is not None
    ]
    if len(given) > 1:
        raise ValueError(f"give one source, not {' and '.join(given)}")
    if columns is not None and listing is None:
        raise ValueError("columns= describes a listing's columns; give listing= too")
    if coco_masks and coco is None:
        raise ValueError("coco_masks=True draws a COCO file's masks; give coco= too")
    if listing is not None:
        path = base / listing
        return _catalog(path.parent, _from_listing(path, columns))
    if coco is not None:
        return _catalog(base, coco_samples(base, base / coco, masks=coco_masks))
    if masks is not None:
        return _catalog(base, paired_samples(base, masks))
    found, classes, splits, skipped = scan_folder(base)
    return _catalog(base, SourceSamples(found, classes, splits, skipped))


def _from_listing(path: Path, columns: ColumnSpec | None) -> SourceSamples:
    shown = printable(path)
    rows = read_rows(path)
    if not rows:
        raise EmptyDatasetError(f"sample listing '{shown}' lists no sample")
    folder = path.parent
    folder_real = resolve(folder)
    csv = path.suffix.lower() not in JSONL_SUFFIXES
    schema = listing_schema(shown, [(r[0], r[4]) for r in rows], columns, csv=csv)
    has_split = rows[0][3] is not None
    labelled = rows[0][2] is not None
    if not labelled and not schema:
        raise ValueError(
            f"sample listing '{shown}' gives neither labels nor target columns; expected "
            "path,label[,split] or target columns"
        )
    by_index = labelled and all(isinstance(r[2], int) for r in rows)
    if labelled and not by_index and any(isinstance(r[2], int) for r in rows):
        raise ValueError(f"sample listing '{shown}' mixes integer and string labels; use one kind")
    if by_index:
        check_label_range(shown, rows)
    out = SourceSamples([], (), ())
    seen: dict[str, int] = {}
    folders: dict[str, str] = {}  # relative folder -> real path
    targets = RowTargets(schema, csv=csv, folder=folder, folder_real=folder_real, folders=folders)
    for line, rel, label, split, extras in rows:
        where = f"{shown}:{line}"
        if (split is not None) != has_split:
            raise ValueError(f"{where}: give a split on every line or on none")
        if (label is not None) != labelled:
            raise ValueError(f"{where}: give a label on every line or on none")
        if split is not None and split not in SPLIT_NAMES:
            raise ValueError(f"{where}: split '{printable(split)}' is not one of {SPLIT_NAMES}")
        norm = check_path(where, rel)
        if norm in seen:
            raise ValueError(
                f"{where}: path '{printable(rel)}' is already listed on line {seen[norm]}"
            )
        seen[norm] = line
        full = folder / norm
        check_file(where, rel, norm, full, folder_real, folders)
        if schema:
            try:
                out.targets[norm] = targets(where, extras)
            except TargetError as e:
                out.rejected.append((norm, str(e)))
                continue
        out.found.append((split or "", str(label) if labelled else UNLABELLED, norm, str(full)))
    if not out.found:
        raise EmptyDatasetError(
            f"sample listing '{shown}': every row was quarantined; the first: {out.rejected[0][1]}"
        )
    if by_index:
        out.classes = tuple(str(i) for i in range(max(int(str(r[2])) for r in rows) + 1))
    else:
        out.classes = tuple(sorted({cls for _, cls, _, _ in out.found}))
    out.splits = tuple(s for s in SPLIT_NAMES if any(f[0] == s for f in out.found))
    out.schema = schema
    return out


def _catalog(root: Path, src: SourceSamples) -> Catalog:
    index = {c: i for i, c in enumerate(src.classes)}
    order = {s: i for i, s in enumerate(("", *SPLIT_NAMES))}
    found: list[Found] = sorted(src.found, key=lambda f: (order[f[0]], index[f[1]], f[2]))
    targets = src.targets
    samples = tuple(
        Sample(path=p, relpath=rel, label=index[c], split=s, targets=targets.get(rel, ()))
        for s, c, rel, p in found
    )
    return Catalog(
        root=str(root),
        samples=samples,
        classes=src.classes,
        splits=src.splits,
        skipped=dict(sorted(src.skipped.items())),
        schema=src.schema,
        rejected=tuple(src.rejected),
    )

"""Find the samples of a dataset: an ImageFolder tree or a CSV/JSONL manifest -> :class:`Catalog`.

ImageFolder: ``root/<class>/<file>``, or ``root/<split>/<class>/<file>`` when every top-level
folder is a split name (``train``, ``val``, ``validation``, ``test``). Files below a class folder
are found recursively. Hidden entries (name starts with ``.``), files without an image extension,
broken links, files outside a class folder, directories already visited below the same class
folder and links to the class folder or a folder above it (symlink loops) are skipped and counted
in :attr:`Catalog.skipped`. Symlinks to files and folders are followed while they stay inside
the root: a link whose real target is outside it is skipped (``link-outside-root``), so a tree
from someone else cannot make a pack read ``/etc`` or a home folder. Folders more than
:data:`MAX_DEPTH` levels below a class folder are skipped (``folder-too-deep``), as are paths
the kernel cannot name (``path-too-long``); the walk is iterative, so depth never exhausts the
stack.

Manifest: see :func:`discover`. Every error names the manifest and the physical line (the line
a CSV record starts on, so a quoted field holding newlines does not shift the count), and names
from the manifest are shown escaped (:func:`h5forge.text.printable`).

Order is deterministic: by split (in ``SPLIT_NAMES`` order), then class, then relpath (code
point order); labels index the sorted class names.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from h5forge._staging import MAX_DEPTH, MAX_LINKS, is_within, resolve
from h5forge.errors import EmptyDatasetError
from h5forge.text import printable

__all__ = [
    "IMAGE_EXTENSIONS",
    "LABEL_FLOOR",
    "MAX_DEPTH",
    "MAX_LABEL_CHARS",
    "MAX_LINE_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_ROWS",
    "MAX_PATH_BYTES",
    "SPLIT_NAMES",
    "Catalog",
    "Sample",
    "discover",
]

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
SPLIT_NAMES = ("train", "val", "validation", "test")
_INT = re.compile(r"[0-9]+")

# Manifest bounds. Each is far above a real manifest (ImageNet-21k's 14 M rows are ~1 GB of
# CSV and would be split) and keeps a hostile one from costing more than its size justifies.
MAX_MANIFEST_BYTES = 2 * 2**30
MAX_MANIFEST_ROWS = 10_000_000
MAX_LINE_BYTES = 2**20  # one physical line; a CSV field is also capped by csv.field_size_limit()
MAX_PATH_BYTES = 4096  # PATH_MAX
MAX_LABEL_CHARS = 1024
# Integer labels must be below max(rows, LABEL_FLOOR): see _check_label_range.
LABEL_FLOOR = 1024


@dataclass(frozen=True)
class Sample:
    """One source image.

    Attributes:
        path: absolute local path of the source file.
        relpath: POSIX path relative to the dataset root (what the file records).
        label: class index, ``0..K-1``.
        split: split name, ``""`` when the dataset has no splits.
    """

    path: str
    relpath: str
    label: int
    split: str


@dataclass(frozen=True)
class Catalog:
    """Every sample of a dataset, in a deterministic order.

    Attributes:
        root: absolute dataset root; relpaths are relative to it (the manifest's folder for a
            manifest).
        samples: sorted by split order, class, relpath.
        classes: class names; label ``i`` is ``classes[i]``.
        splits: split names present, in ``SPLIT_NAMES`` order; ``()`` when there are none.
        skipped: reason -> number of entries left out.
    """

    root: str
    samples: tuple[Sample, ...]
    classes: tuple[str, ...]
    splits: tuple[str, ...]
    skipped: dict[str, int]

    def counts(self) -> dict[str, dict[str, int]]:
        """``{split: {class: samples}}``; the split is ``""`` when there are none."""
        out: dict[str, dict[str, int]] = {}
        for s in self.samples:
            per_class = out.setdefault(s.split, {})
            per_class[self.classes[s.label]] = per_class.get(self.classes[s.label], 0) + 1
        return out


def discover(root: str | os.PathLike[str], *,
             manifest: str | os.PathLike[str] | None = None) -> Catalog:
    """Build the catalog of an ImageFolder tree or of a manifest.

    A manifest is CSV with a header ``path,label[,split]`` (other columns are ignored) or JSONL
    (``.jsonl``/``.ndjson``) with objects holding ``path``, ``label`` and optionally ``split``.
    Paths are POSIX, relative to the manifest's folder, and may not leave it, lexically or
    through symbolic links (the real target is checked); each must be a regular file (a FIFO or
    device is refused, never opened). Labels are class names (strings) or class indices: JSON
    integers, or CSV labels that are all decimal digits. Names are sorted to give indices;
    indices ``0..max`` are kept as given and the classes are named ``"0"``, ``"1"``, ...; an
    index must be below ``max(rows, LABEL_FLOOR)``, so the classes made are bounded by the
    manifest, never by a label's value. Manifest entries are used as listed (no extension
    filter). Bounds: :data:`MAX_MANIFEST_BYTES`, :data:`MAX_MANIFEST_ROWS`,
    :data:`MAX_LINE_BYTES` per physical line, ``csv.field_size_limit()`` per CSV field,
    :data:`MAX_PATH_BYTES` per path, :data:`MAX_LABEL_CHARS` per label. CSV rows must have as
    many fields as the header; text must be UTF-8 (a BOM is allowed) without NUL bytes.

    Args:
        root: the ImageFolder root; with ``manifest``, the folder a relative manifest path is
            resolved against.
        manifest: path of a CSV or JSONL manifest, or None for an ImageFolder.

    Returns:
        The catalog.

    Raises:
        FileNotFoundError: ``root``, the manifest or a file it lists does not exist.
        NotADirectoryError: ``root`` is not a folder.
        ValueError: mixed split/class top-level folders, or a malformed manifest line (the
            message names the manifest, the line, the value and the rule).
        EmptyDatasetError: no image at all, or a class folder without an image.
    """
    base = Path(os.path.abspath(root))
    if not base.exists():
        raise FileNotFoundError(f"dataset root {str(base)!r} does not exist")
    if not base.is_dir():
        raise NotADirectoryError(f"dataset root {str(base)!r} is not a folder; give the folder "
                                 "that holds the class (or split) folders")
    if manifest is not None:
        return _from_manifest(base / manifest)
    return _from_folder(base)


def _from_folder(root: Path) -> Catalog:
    skipped: Counter[str] = Counter()
    root_real = resolve(root)
    top = _subdirs(root, skipped, root_real)
    if not top:
        raise EmptyDatasetError(f"no class folders in {str(root)!r}; expected root/<class>/<file> "
                                "or root/<split>/<class>/<file>, or pass a manifest")
    split_dirs = [n for n in top if n in SPLIT_NAMES]
    if split_dirs and len(split_dirs) != len(top):
        others = [n for n in top if n not in SPLIT_NAMES]
        raise ValueError(
            f"{str(root)!r} mixes split folders {split_dirs} with class folders {others}; put "
            f"every class under a split folder ({', '.join(SPLIT_NAMES)}) or rename the splits")
    splits = tuple(s for s in SPLIT_NAMES if s in split_dirs)
    found: list[tuple[str, str, str, str]] = []  # (split, class, relpath, path)
    for split in splits or ("",):
        folder = root / split if split else root
        class_names = _subdirs(folder, skipped, root_real) if split else top
        if split and not class_names:
            raise EmptyDatasetError(f"split folder {str(folder)!r} holds no class folder")
        for cls in class_names:
            before = skipped.copy()
            files = _walk(folder / cls, skipped, root_real)
            if not files:
                left_out = ", ".join(f"{n} {why}" for why, n in sorted((skipped - before).items()))
                raise EmptyDatasetError(f"class folder {str(folder / cls)!r} holds no image file "
                                        f"({', '.join(sorted(IMAGE_EXTENSIONS))}); add images "
                                        "or remove the folder"
                                        + (f" (left out: {left_out})" if left_out else ""))
            prefix = f"{split}/{cls}" if split else cls
            found += [(split, cls, f"{prefix}/{rel}", str(folder / cls / rel)) for rel in files]
    classes = tuple(sorted({cls for _, cls, _, _ in found}))
    return _catalog(root, found, classes, splits, skipped)


def _subdirs(folder: Path, skipped: Counter[str], root_real: str) -> list[str]:
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                skipped["hidden"] += 1
            elif entry.is_dir():
                if entry.is_symlink():
                    real = _real(entry.path)
                    if real is None or real == root_real or \
                            root_real.startswith(real.rstrip(os.sep) + os.sep):
                        skipped["revisited-folder"] += 1  # the root or above it: a loop
                        continue
                    if not is_within(root_real, real):
                        skipped["link-outside-root"] += 1
                        continue
                _check_utf8(entry.name, folder)
                names.append(entry.name)
            elif entry.is_file():
                skipped["outside-class-folder"] += 1
            else:
                skipped["broken-link-or-special-file"] += 1
    return sorted(names)


def _real(path: str) -> str | None:
    """The real path of ``path``, or None when resolving it needs over MAX_LINKS links."""
    try:
        return resolve(path)
    except ValueError:
        return None


def _walk(class_dir: Path, skipped: Counter[str], root_real: str) -> list[str]:
    """Relative POSIX paths of the image files below ``class_dir``, following symlinks.

    Links are followed only while their real target stays inside ``root_real``. Iterative:
    a stack of ``(relative folder, depth)``, never recursion.
    """
    top = resolve(class_dir)
    seen = {top}
    seen_real = {"": top}  # relative folder -> its real path
    stack = [("", 0)]
    files = []
    while stack:
        rel, depth = stack.pop()
        try:
            entries = os.scandir(class_dir / rel)
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                raise
            skipped["path-too-long"] += 1  # longer than PATH_MAX: the kernel cannot name it
            continue
        with entries:
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.name.startswith("."):
                    skipped["hidden"] += 1
                elif entry.is_dir():
                    # A real folder inside a real folder needs no resolving: one lstat saved
                    # per folder of a large tree.
                    real = _real(entry.path) if entry.is_symlink() else f"{seen_real[rel]}/" \
                        f"{entry.name}"
                    # A link to the class folder or to any folder above it (e.g. "loop -> ..")
                    # would walk back into this class or into the other classes: a loop.
                    if real is None or real in seen or top.startswith(real.rstrip(os.sep) + os.sep):
                        skipped["revisited-folder"] += 1  # a symlink loop or a second link
                    elif not is_within(root_real, real):
                        skipped["link-outside-root"] += 1
                    elif depth + 1 > MAX_DEPTH:
                        skipped["folder-too-deep"] += 1
                    else:
                        seen.add(real)
                        seen_real[name] = real
                        stack.append((name, depth + 1))
                elif not entry.is_file():
                    skipped["broken-link-or-special-file"] += 1
                elif entry.is_symlink() and not is_within(root_real, _real(entry.path) or "/"):
                    skipped["link-outside-root"] += 1
                elif os.path.splitext(entry.name)[1].lower() not in IMAGE_EXTENSIONS:
                    skipped["not-an-image-extension"] += 1
                elif not _is_utf8(name):
                    skipped["name-not-utf8"] += 1
                else:
                    files.append(name)
    return sorted(files)


def _from_manifest(path: Path) -> Catalog:
    shown = printable(path)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"manifest '{shown}' does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"manifest '{shown}' is {_kind(st.st_mode)}, not a regular file")
    if st.st_size > MAX_MANIFEST_BYTES:
        raise ValueError(f"manifest '{shown}' is {st.st_size:,} bytes, over the limit of "
                         f"{MAX_MANIFEST_BYTES:,}; split it or pack from an ImageFolder")
    rows = list(_read_jsonl(path) if path.suffix.lower() in (".jsonl", ".ndjson")
                else _read_csv(path))
    if not rows:
        raise EmptyDatasetError(f"manifest '{shown}' lists no sample")
    folder = path.parent
    folder_real = resolve(folder)
    has_split = rows[0][3] is not None
    by_index = all(isinstance(r[2], int) for r in rows)
    if not by_index and any(isinstance(r[2], int) for r in rows):
        raise ValueError(f"manifest '{shown}' mixes integer and string labels; use one kind")
    if by_index:
        _check_label_range(shown, rows)
    found: list[tuple[str, str, str, str]] = []
    seen: dict[str, int] = {}
    folders: dict[str, str] = {}  # relative folder -> real path
    for line, rel, label, split in rows:
        where = f"{shown}:{line}"
        if (split is not None) != has_split:
            raise ValueError(f"{where}: give a split on every line or on none")
        if split is not None and split not in SPLIT_NAMES:
            raise ValueError(f"{where}: split '{printable(split)}' is not one of {SPLIT_NAMES}")
        norm = _check_path(where, rel)
        if norm in seen:
            raise ValueError(f"{where}: path '{printable(rel)}' is already listed on line "
                             f"{seen[norm]}")
        seen[norm] = line
        full = folder / norm
        _check_file(where, rel, norm, full, folder_real, folders)
        found.append((split or "", str(label), norm, str(full)))
    if by_index:
        classes = tuple(str(i) for i in range(max(int(r[2]) for r in rows) + 1))
    else:
        classes = tuple(sorted({cls for _, cls, _, _ in found}))
    splits = tuple(s for s in SPLIT_NAMES if any(f[0] == s for f in found))
    return _catalog(folder, found, classes, splits, Counter())


def _check_label_range(shown: str, rows: list[_Row]) -> None:
    """Integer labels name classes ``0..max``: bound ``max`` by what the rows can justify.

    ``max + 1`` class names are made, so a label of 2**40 would allocate for 2**40 names. A
    manifest of R rows uses at most R classes; up to :data:`LABEL_FLOOR` is allowed whatever
    the row count, so a small manifest can keep the indices of a 1,000-class dataset.
    """
    bound = max(len(rows), LABEL_FLOOR)
    for line, _, label, _ in rows:
        if isinstance(label, int) and label >= bound:
            raise ValueError(
                f"{shown}:{line}: label {printable(label, limit=40)} is out of range: a manifest "
                f"of {len(rows):,} rows may use integer labels 0..{bound - 1:,} (at most one "
                f"class per row, or {LABEL_FLOOR:,} for a small manifest); number the classes "
                "from 0, or give class names instead of numbers")


def _check_path(where: str, rel: str) -> str:
    """The normalised POSIX form of a manifest path, refused when it may not be used."""
    if not rel:
        raise ValueError(f"{where}: empty path; give the image's path relative to the "
                         "manifest's folder")
    if "\x00" in rel:
        raise ValueError(f"{where}: path '{printable(rel)}' contains a NUL byte")
    size = len(rel.encode("utf-8", "surrogateescape"))
    if size > MAX_PATH_BYTES:
        raise ValueError(f"{where}: path '{printable(rel)}' is {size:,} bytes, over the limit of "
                         f"{MAX_PATH_BYTES:,} (PATH_MAX)")
    norm = os.path.normpath(rel).replace(os.sep, "/")
    if os.path.isabs(rel) or norm == ".." or norm.startswith("../"):
        raise ValueError(f"{where}: path '{printable(rel)}' must be relative to the manifest's "
                         "folder and stay inside it")
    return norm


def _check_file(where: str, rel: str, norm: str, full: Path, folder_real: str,
                folders: dict[str, str]) -> None:
    """``full`` must be a regular file whose real path (links resolved) is inside the folder.

    ``folders`` caches the real path of each parent folder seen, so a plain file costs one
    ``lstat``: a million-row manifest is checked in about the time a bare ``is_file`` took.
    """
    parent, _, leaf = norm.rpartition("/")
    try:
        parent_real = folders.get(parent)
        if parent_real is None:
            parent_real = folders[parent] = resolve(parent, base=folder_real)
        real = f"{parent_real}/{leaf}"
        try:
            st = os.lstat(real)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            real = resolve(leaf, base=parent_real)
            st = None
    except ValueError:
        raise ValueError(f"{where}: path '{printable(rel)}' passes more than {MAX_LINKS} symbolic "
                         "links (a loop?)") from None
    if not is_within(folder_real, real):
        raise ValueError(
            f"{where}: path '{printable(rel)}' is a symbolic link (or passes through one) to "
            f"'{printable(real)}', outside the manifest's folder '{printable(folder_real)}'; "
            "copy the file in, or put the manifest in a folder that holds both")
    try:
        st = st or os.stat(real)  # stat, never open: opening a FIFO would block
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{where}: file '{printable(rel)}' not found (looked for "
                                f"'{printable(full)}')") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{where}: path '{printable(rel)}' is {_kind(st.st_mode)}, not a "
                         "regular file; list image files only")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


# (line, path, label, split): ``line`` is the physical line the record starts on.
_Row = tuple[int, str, str | int, str | None]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each physical line, decoded strictly, bounded in length."""
    shown = printable(path)
    with open(path, "rb") as f:
        number = 0
        while True:
            raw = f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise ValueError(f"{shown}:{number}: line is longer than {MAX_LINE_BYTES:,} "
                                 "bytes; is this really a manifest?")
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark, as some spreadsheets write
            nul = raw.find(b"\x00")
            if nul >= 0:
                raise ValueError(f"{shown}:{number}: NUL byte at column {nul + 1}; a manifest "
                                 "is UTF-8 text (is it UTF-16, or binary?)")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{shown}:{number}: byte 0x{raw[e.start]:02x} at column {e.start + 1} is "
                    "not UTF-8; save the manifest as UTF-8") from None
            if number > MAX_MANIFEST_ROWS + 1:  # +1: the CSV header
                raise ValueError(f"{shown}:{number}: more than {MAX_MANIFEST_ROWS:,} lines; "
                                 "split the manifest")
            yield number, text


def _read_csv(path: Path) -> Iterator[_Row]:
    shown = printable(path)
    # _lines yields every physical line, so the reader's line_num counts physical lines.
    reader = csv.reader(text for _, text in _lines(path))
    header: list[str] | None = None
    records: list[tuple[int, list[str]]] = []
    consumed = 0
    while True:
        start = consumed + 1  # the physical line this record starts on
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise ValueError(_csv_error(shown, reader.line_num, str(e))) from None
        consumed = reader.line_num
        if not fields:
            continue  # a blank line
        if header is None:
            header = fields
            missing = {"path", "label"} - set(header)
            if missing:
                raise ValueError(f"{shown}:{start}: header {[printable(h) for h in header]} "
                                 f"lacks {sorted(missing)}; expected path,label[,split]")
            dupes = sorted({h for h in header if header.count(h) > 1})
            if dupes:
                raise ValueError(f"{shown}:{start}: header names {dupes} more than once")
            continue
        if len(fields) != len(header):
            raise ValueError(f"{shown}:{start}: {len(fields)} fields, but the header has "
                             f"{len(header)} ({','.join(printable(h) for h in header)}); quote "
                             "fields that contain commas")
        records.append((start, fields))
    if header is None:
        return
    at = {name: header.index(name) for name in ("path", "label", "split") if name in header}
    labels = [fields[at["label"]] for _, fields in records]
    digits = all(_INT.fullmatch(label) for label in labels)
    for (line, fields), label in zip(records, labels, strict=True):
        if not label:
            raise ValueError(f"{shown}:{line}: empty label")
        if len(label) > MAX_LABEL_CHARS:
            raise ValueError(f"{shown}:{line}: label is {len(label):,} characters, over the "
                             f"limit of {MAX_LABEL_CHARS:,}")
        split = fields[at["split"]] if "split" in at else None
        yield line, fields[at["path"]], int(label) if digits else label, split


def _csv_error(shown: str, line: int, message: str) -> str:
    if "field larger than field limit" in message:
        return (f"{shown}:{line}: a field is longer than {csv.field_size_limit():,} characters "
                "(the CSV parser's limit); no path or label is that long: is a quote left "
                "open on an earlier line?")
    return f"{shown}:{line}: malformed CSV ({printable(message)})"


def _read_jsonl(path: Path) -> Iterator[_Row]:
    shown = printable(path)
    for line, text in _lines(path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{shown}:{line}: not JSON ({e.msg})") from None
        except (ValueError, RecursionError) as e:  # a 5,000-digit number, [[[[... nested deep
            raise ValueError(f"{shown}:{line}: not usable JSON ({type(e).__name__}: "
                             f"{printable(e, limit=120)})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("path"), str):
            raise ValueError(f"{shown}:{line}: expected an object with a string 'path'")
        label = obj.get("label")
        if (isinstance(label, bool) or not isinstance(label, (int, str)) or label == ""
                or (isinstance(label, int) and label < 0)):
            raise ValueError(f"{shown}:{line}: label {printable(repr(label), limit=60)} must be "
                             "a class name or an int >= 0")
        if isinstance(label, str) and len(label) > MAX_LABEL_CHARS:
            raise ValueError(f"{shown}:{line}: label is {len(label):,} characters, over the "
                             f"limit of {MAX_LABEL_CHARS:,}")
        split = obj.get("split")
        if split is not None and not isinstance(split, str):
            raise ValueError(f"{shown}:{line}: split {printable(repr(split), limit=60)} must be "
                             "a string")
        yield line, obj["path"], label, split


def _catalog(root: Path, found: list[tuple[str, str, str, str]], classes: tuple[str, ...],
             splits: tuple[str, ...], skipped: Counter[str]) -> Catalog:
    index = {c: i for i, c in enumerate(classes)}
    order = {s: i for i, s in enumerate(("", *SPLIT_NAMES))}
    found.sort(key=lambda f: (order[f[0]], index[f[1]], f[2]))
    samples = tuple(Sample(path=p, relpath=rel, label=index[c], split=s) for s, c, rel, p in found)
    return Catalog(root=str(root), samples=samples, classes=classes, splits=splits,
                   skipped=dict(sorted(skipped.items())))


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes in the name, kept as surrogates by os
        return False
    return True


def _check_utf8(name: str, folder: Path) -> None:
    if not _is_utf8(name):
        raise ValueError(f"folder name {name!r} in {str(folder)!r} is not valid UTF-8; rename it")

"""The ImageFolder walk: ``root/<class>/<file>`` or ``root/<split>/<class>/<file>``, untrusted.

Files below a class folder are found recursively, iteratively (a stack, never recursion), so
depth never exhausts the stack. Symbolic links are followed only while their real target stays
inside the root; hidden entries, files without an image extension, broken links, links back to a
class folder or above (loops), folders deeper than :data:`~h5forge.paths.MAX_DEPTH` and paths
the kernel cannot name are left out and counted by reason.
:mod:`h5forge.discover.catalog` sorts what is found into a catalog.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from pathlib import Path

from h5forge.errors import EmptyDatasetError
from h5forge.paths import MAX_DEPTH, is_within, resolve

__all__ = ["IMAGE_EXTENSIONS", "SPLIT_NAMES", "Found", "scan_folder", "walk_images"]

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
)
SPLIT_NAMES = ("train", "val", "validation", "test")

# One image found: (split, class, relpath, path); the split is "" when there are none.
Found = tuple[str, str, str, str]


def scan_folder(
    root: Path,
) -> tuple[list[Found], tuple[str, ...], tuple[str, ...], Counter[str]]:
    """Walk the ImageFolder tree at ``root``: ``(found, classes, splits, skipped)``.

    ``found`` holds one ``(split, class, relpath, path)`` per image, unsorted; ``classes`` are
    sorted; ``splits`` in :data:`SPLIT_NAMES` order; ``skipped`` counts what was left out, by
    reason.

    Raises:
        EmptyDatasetError: no class folder, or a class folder without an image.
        ValueError: split folders mixed with class folders, or a folder name not UTF-8.
    """
    skipped: Counter[str] = Counter()
    root_real = resolve(root)
    top = _subdirs(root, skipped, root_real)
    if not top:
        raise EmptyDatasetError(
            f"no class folders in {str(root)!r}; expected root/<class>/<file> "
            "or root/<split>/<class>/<file>, or pass a listing"
        )
    split_dirs = [n for n in top if n in SPLIT_NAMES]
    if split_dirs and len(split_dirs) != len(top):
        others = [n for n in top if n not in SPLIT_NAMES]
        raise ValueError(
            f"{str(root)!r} mixes split folders {split_dirs} with class folders {others}; put "
            f"every class under a split folder ({', '.join(SPLIT_NAMES)}) or rename the splits"
        )
    splits = tuple(s for s in SPLIT_NAMES if s in split_dirs)
    found: list[Found] = []
    for split in splits or ("",):
        folder = root / split if split else root
        class_names = _subdirs(folder, skipped, root_real) if split else top
        if split and not class_names:
            raise EmptyDatasetError(f"split folder {str(folder)!r} holds no class folder")
        for cls in class_names:
            before = skipped.copy()
            files = walk_images(folder / cls, skipped, root_real)
            if not files:
                left_out = ", ".join(f"{n} {why}" for why, n in sorted((skipped - before).items()))
                raise EmptyDatasetError(
                    f"class folder {str(folder / cls)!r} holds no image file "
                    f"({', '.join(sorted(IMAGE_EXTENSIONS))}); add images "
                    "or remove the folder" + (f" (left out: {left_out})" if left_out else "")
                )
            prefix = f"{split}/{cls}" if split else cls
            base = str(folder / cls)  # joined as strings: two Path joins per file cost 15 us
            found += [(split, cls, f"{prefix}/{rel}", os.path.join(base, rel)) for rel in files]
    classes = tuple(sorted({cls for _, cls, _, _ in found}))
    return found, classes, splits, skipped


def _subdirs(folder: Path, skipped: Counter[str], root_real: str) -> list[str]:
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                skipped["hidden"] += 1
            elif entry.is_dir():
                if entry.is_symlink():
                    real = _real(entry.path)
                    if (
                        real is None
                        or real == root_real
                        or root_real.startswith(real.rstrip(os.sep) + os.sep)
                    ):
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


def walk_images(class_dir: Path, skipped: Counter[str], root_real: str) -> list[str]:
    """Relative POSIX paths of the image files below ``class_dir``, sorted, following links.

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
                    real = (
                        _real(entry.path)
                        if entry.is_symlink()
                        else f"{seen_real[rel]}/{entry.name}"
                    )
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


def _is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes in the name, kept as surrogates by os
        return False
    return True


def _check_utf8(name: str, folder: Path) -> None:
    if not _is_utf8(name):
        raise ValueError(f"folder name {name!r} in {str(folder)!r} is not valid UTF-8; rename it")

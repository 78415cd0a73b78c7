"""What a pack checks: its arguments before any work, and the quarantine limits of a pack or
merge (too many bad inputs, or a class left empty)."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from h5forge.discover.catalog import Catalog
from h5forge.errors import EmptyDatasetError, TooManyBadImagesError
from h5forge.options import option
from h5forge.pack.commit import check_output
from h5forge.pack.config import PackConfig

__all__ = ["check_bad_fraction", "check_every_class", "check_pack", "check_quarantine"]


def check_pack(
    config: PackConfig,
    out: str | os.PathLike[str],
    workers: int | None,
    max_bad_fraction: float,
    overwrite: bool,
    how: str,
) -> tuple[Path, dict[str, Any]]:
    """Every argument of a pack checked before any work: the output path (``how``: how the
    caller asks for an overwrite), and the ``/images`` filters.

    Raises:
        TypeError: ``config`` is not a :class:`PackConfig`.
        OptionError: ``workers`` or ``max_bad_fraction`` out of bounds.
        MissingExtraError: the codec needs ``hdf5plugin``, which is not installed.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
    """
    if not isinstance(config, PackConfig):
        raise TypeError(f"config={config!r} must be a PackConfig (h5forge.pack.config)")
    filters = config.filter_kwargs()  # a missing codec plugin fails here, before any work
    option("workers").check(workers)
    option("max_bad_fraction").check(max_bad_fraction)
    return check_output(out, overwrite, how), filters


def check_bad_fraction(total: int, bad: Sequence[tuple[str, str]], max_bad_fraction: float) -> None:
    """Raise ``TooManyBadImagesError`` when more than the allowed fraction was quarantined.

    Args:
        total: every input, packed plus quarantined.
        bad: ``(relative path, reason)`` of each quarantined input.
    """
    if bad and len(bad) > max_bad_fraction * total:
        first = "\n  ".join(f"{p}: {r}" for p, r in bad[:10])
        raise TooManyBadImagesError(
            f"{len(bad)} of {total} inputs ({len(bad) / total:.1%}) were quarantined, more than "
            f"max_bad_fraction={max_bad_fraction:g} allows; first reasons:\n  {first}\n"
            "fix or remove these files, or raise max_bad_fraction",
            list(bad),
        )


def check_every_class(present: Collection[int], classes: Sequence[str], where: str) -> None:
    """Raise ``EmptyDatasetError`` when a class has no packed sample.

    Args:
        present: the labels of the packed samples.
        classes: every class name, by label.
        where: names the input in the message (a folder, or "the 8 parts").
    """
    for label, name in enumerate(classes):
        if label not in present:
            raise EmptyDatasetError(
                f"class {name!r} has no readable image in {where}: every file of it was "
                "quarantined; fix the files or remove the class folder"
            )


def check_quarantine(
    catalog: Catalog,
    kept: Sequence[int],
    bad: Sequence[tuple[str, str]],
    max_bad_fraction: float,
    every_class: bool,
) -> list[tuple[str, str]]:
    """A pack's quarantine: the catalog's rejected rows, then ``bad`` (quarantined while
    packing), checked against ``max_bad_fraction`` (of every input, rejected ones included)
    and, with ``every_class``, that no class lost all its samples (``kept``: catalog indices).
    """
    bad = [*catalog.rejected, *bad]
    check_bad_fraction(len(catalog.samples) + len(catalog.rejected), bad, max_bad_fraction)
    if every_class:
        present = {catalog.samples[i].label for i in kept}
        check_every_class(present, catalog.classes, catalog.root)
    return bad

"""A run's private scratch folder in TMPDIR, and the sweep of folders dead runs left there.

A killed run cannot delete its folder, which holds the packed file (as large as the dataset);
each new one first removes the folders of dead runs: ``h5forge-build-*`` folders that carry
h5forge's marker (:mod:`h5forge.files`) and whose lock it can take (:func:`h5forge.locks.flock`:
the kernel drops a dead process's locks). The marker is written only once the folder is
locked, so a marked, unlocked folder is a dead run's; a folder of the user's named like one
carries no marker and stays, and removal never follows a link.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from h5forge.files import MARKER_NAME, is_ours, mark, remove_marked, same_file
from h5forge.locks import flock, open_folder

__all__ = ["WORK_MARK", "WORK_PREFIX", "remove_dead_runs", "remove_if_dead", "work_dir"]

WORK_PREFIX = "h5forge-build-"
WORK_MARK = "build-work"  # the kind in the marker h5forge writes into its work folders


@contextmanager
def work_dir() -> Iterator[Path]:
    """This run's private scratch folder in TMPDIR, marked as h5forge's and locked (flock)
    while the run lives; removed on exit. Dead runs' folders are removed first."""
    remove_dead_runs()
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX))  # a new name, mode 0o700
    fd = open_folder(work, follow=False)
    try:
        flock(fd)
        mark(work, WORK_MARK)
        try:
            yield work
        finally:
            _remove_own(work)
    finally:
        os.close(fd)


def _remove_own(work: Path) -> None:
    """Remove this run's folder, its marker last: a run killed in the middle leaves a marked
    folder, which the next run removes (with the marker gone first, what is left would look
    like the user's folder and stay: the packed file, as large as the dataset)."""
    with contextlib.suppress(OSError), os.scandir(work) as entries:
        for entry in entries:
            if entry.name == MARKER_NAME:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    shutil.rmtree(work, ignore_errors=True)


def remove_dead_runs() -> None:
    """Remove the work folders that dead runs left in TMPDIR (:func:`remove_if_dead`): every
    run does this first, a run refused before it packs too (a killed build's folder holds a
    file as large as its dataset)."""
    for old in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}*"):
        remove_if_dead(old)


def remove_if_dead(old: Path) -> None:
    """Remove ``old`` if it is a dead run's work folder (marked by h5forge, lock free)."""
    try:
        fd = open_folder(old, follow=False)
    except OSError:
        return  # a symlink, not a folder, gone meanwhile, or not ours to look at
    try:
        if not is_ours(old, WORK_MARK):
            return  # not made by h5forge (or not by this user): never removed
        if not flock(fd, wait=False):
            return  # a live run holds it
        if same_file(os.fstat(fd), os.lstat(old)):  # still the folder we locked
            remove_marked(old, WORK_MARK)
    finally:
        os.close(fd)

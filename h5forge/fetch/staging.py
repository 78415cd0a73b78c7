"""Staging folders of a fetch destination: made beside it, committed by rename, swept when dead.

A staging folder is created next to its destination (same filesystem, so the final rename is
atomic), filled, then renamed into place. Anything that goes wrong removes the staging folder.
A process killed meanwhile cannot clean up: :func:`exclusive` serialises the writers of one
destination and removes what dead writers left beside it (``DEST.staging-*``,
``DEST.incoming-*``, ``DEST.old-*``), which are never taken as data. A leftover is recognised by
the marker h5forge writes into each of these folders (:mod:`h5forge.files`), never by its name
alone: a folder of the user's with a look-alike name stays. The marker is removed just before a
folder becomes the destination itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from h5forge.files import make_marked_dir, mark, remove_marked, remove_tree, unmark
from h5forge.locks import LOCK_SUFFIX, lock_file

__all__ = ["LEFTOVER_KINDS", "commit", "discard", "exclusive", "new_staging"]

log = logging.getLogger("h5forge.fetch.sources")

# Names of the temporary siblings of a destination folder (see new_staging, commit, fetch).
LEFTOVER_KINDS = ("staging", "incoming", "old")
_LEFTOVER_NAME = re.compile(r"\.(staging|incoming|old)-[0-9a-f]{12}$")
_MARK = "staging"  # the kind recorded in the marker of these folders


def new_staging(dest: Path) -> Path:
    """Create and return a fresh staging folder next to ``dest``, holding only h5forge's marker
    (which :func:`commit` removes before the folder becomes ``dest``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return make_marked_dir(dest.with_name(f"{dest.name}.staging-{secrets.token_hex(6)}"), _MARK)


def discard(path: Path) -> None:
    """Remove a staging folder (symlinks inside are removed, never followed).

    Iterative and relative to directory descriptors, unlike ``shutil.rmtree`` (recursive before
    Python 3.12, and by path): a tree thousands of folders deep, or one whose real path is longer
    than PATH_MAX (folders created through in-tree links), is removed all the same.
    """
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        remove_tree(path)


def commit(staging: Path, dest: Path, *, replace: bool) -> None:
    """Rename ``staging`` to ``dest``.

    An empty ``dest`` folder is replaced silently. A non-empty one is replaced only with
    ``replace=True``: it is renamed aside first, so ``dest`` is never a mix of old and new.

    Raises:
        FileExistsError: ``dest`` exists, is not an empty folder, and ``replace`` is False.
    """
    if not _LEFTOVER_NAME.search(dest.name):  # the real destination, not a step towards it
        unmark(staging)
    if dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
        dest.rmdir()
    if not (dest.exists() or dest.is_symlink()):
        os.rename(staging, dest)
        return
    if not replace:
        raise FileExistsError(
            f"destination {str(dest)!r} already exists and is not empty; "
            "remove it or choose a new folder"
        )
    old = dest.with_name(f"{dest.name}.old-{secrets.token_hex(6)}")
    os.rename(dest, old)
    with contextlib.suppress(OSError):  # unmarked (read-only?): a kill now leaves it, kept
        mark(old, _MARK)  # so that a run killed before discard() has it removed by the next
    os.rename(staging, dest)
    discard(old)


@contextmanager
def exclusive(dest: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``dest`` (the file ``DEST.lock`` beside it) and clear leftovers.

    Writers of one destination take turns (:func:`h5forge.locks.lock_file`, waiting); once the
    lock is held nobody else is writing it, so every ``DEST.staging-*``, ``DEST.incoming-*`` and
    ``DEST.old-*`` sibling was left by a writer that died (killed, power loss) and is removed.
    The kernel releases the lock when its holder dies, so a killed run never blocks the next
    one; the lock file is removed on exit.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with lock_file(dest.with_name(f"{dest.name}{LOCK_SUFFIX}")) as held:
        if held.fd is not None:  # no flock (Windows): no turn-taking, leftovers stay
            _remove_leftovers(dest)
        yield


def _remove_leftovers(dest: Path) -> None:
    prefixes = tuple(f"{dest.name}.{kind}-" for kind in LEFTOVER_KINDS)
    with os.scandir(dest.parent) as entries:
        stale = [Path(e.path) for e in entries if e.name.startswith(prefixes)]
    for path in stale:
        # Only what carries h5forge's marker; a look-alike folder of the user's stays.
        if remove_marked(path, _MARK):
            log.info("removed %s, left by an interrupted fetch", path)
        else:
            log.info("kept %s: named like a leftover, but h5forge did not make it", path)

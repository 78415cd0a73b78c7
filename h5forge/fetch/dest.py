"""The destination folder of a fetch: what may be replaced, the marker, the dataset's root.

A fetch writes only into a folder that is new, empty, or one it made before: it leaves
:data:`MARKER` inside every folder it fills (written before the folder is renamed into place,
so a marker means a complete copy or extraction), and a later fetch of the same archive finds
it and reuses the folder instead of replacing it under a build that is reading it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from h5forge.location import MAX_CACHE_RECORD_BYTES, Location

__all__ = ["MARKER", "already_extracted", "check_dest", "single_root", "write_marker"]

MARKER = ".h5forge-fetch.json"  # written in dest; lets a later fetch replace what it made


def already_extracted(target: Path, digest: str) -> bool:
    """``target`` is a complete extraction of the archive with this sha256 (its marker says so).

    The marker is written inside the folder before it is renamed into place, so a marker means
    a complete extraction. Reusing it keeps a second fetch of the same archive from replacing
    the folder under a build that is reading it.
    """
    try:
        marker = Location.of(target / MARKER).read_json(
            limit=MAX_CACHE_RECORD_BYTES, what="extraction marker"
        )
    except (OSError, ValueError):  # no marker, not a regular file, not JSON h5forge wrote
        return False
    return isinstance(marker, dict) and bool(digest) and marker.get("sha256") == digest


def check_dest(target: Path) -> None:
    """``dest`` must be new, empty, or made by an earlier fetch (never a file or a link)."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise FileExistsError(
            f"dest {str(target)!r} exists and is not a folder; pass a new or empty folder"
        )
    made_by_fetch = (target / MARKER).is_file()
    if target.is_dir() and not made_by_fetch and any(target.iterdir()):
        raise FileExistsError(
            f"dest {str(target)!r} is not empty and was not made by h5forge fetch; "
            "pass a new or empty folder"
        )


def write_marker(folder: Path, shown: str, digest: str) -> None:
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    (folder / MARKER).write_text(json.dumps({"source_url": shown, "sha256": digest, "at": now}))


def single_root(target: Path) -> str:
    """The archive's one top folder if it has exactly one, else ``target`` itself."""
    tops = [e for e in os.scandir(target) if not e.name.startswith(".") and e.name != "__MACOSX"]
    if len(tops) == 1 and tops[0].is_dir(follow_symlinks=False):
        return tops[0].path
    return str(target)

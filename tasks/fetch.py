"""Fetch stage: bring the source (a folder, an archive, any fsspec URL) onto local disk.

Cached by Prefect on (canonical source URL, sha256): a re-run of the same pinned source is
served from the cache instead of downloading and extracting again. The source is a
:class:`~h5forge.location.Location`: its key (:attr:`~h5forge.location.Location.key`, the
canonical URL) enters the cache key, its options, which may hold credentials, never do. The
cache record lives next to the extracted files (``CACHE_DIR/prefect-results``), so both share
one lifetime: delete the cache folder and both are gone. Without a sha256 nothing is cached,
because a URL alone does not pin its content.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from prefect.utilities.hashing import hash_objects

from h5forge.fetch.sources import FetchResult, fetch
from h5forge.location import Location
from h5forge.tasks.common import run_name, with_retries

__all__ = ["fetch_source", "fetch_task", "source_dir"]

_KEY_VERSION = "h5forge-fetch-v1"
# The type of the cached result, named in its cache key: a record written while the task
# returned another type (``h5forge.tasks.fetch.FetchedSource``) reads back as a dict, so it
# must miss.
_RESULT_TYPE = "h5forge.fetch.sources.FetchResult"


def _source_key(source: Location, sha256: str | None) -> str | None:
    if not sha256:
        return None
    return hash_objects(_KEY_VERSION, source.key, sha256.lower())


def source_dir(cache_dir: str | Path, source: str, sha256: str | None) -> Path | None:
    """The folder a pinned source is extracted to, or None when the source is not pinned."""
    key = _source_key(Location(source), sha256)
    return None if key is None else Path(cache_dir) / "sources" / key[:24]


def _fetch_cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    # Credentials (the source's options, a URL's userinfo or signature) are deliberately not
    # part of the key: re-signed or rotated credentials for the same pinned bytes must hit the
    # same cache entry.
    key = _source_key(Location.of(parameters["source"]), parameters.get("sha256"))
    return None if key is None else hash_objects(key, str(parameters["dest"]), _RESULT_TYPE)


_FETCH_CACHE = CachePolicy.from_cache_key_fn(_fetch_cache_key)


@task(
    name="fetch",
    task_run_name=run_name("fetch"),
    **with_retries(3),
    cache_policy=_FETCH_CACHE,
    persist_result=True,
    result_serializer="json",
)
def fetch_source(
    source: Location,
    *,
    dest: str,
    sha256: str | None = None,
    download_cache: str | None = None,
) -> FetchResult:
    """Fetch ``source`` into ``dest`` (see :func:`h5forge.fetch.sources.fetch`).

    The :class:`~h5forge.fetch.sources.FetchResult` is the cached result: Prefect's JSON
    serializer writes a dataclass with its qualified name and reads it back as one.
    """
    return fetch(
        source,
        dest,
        sha256=sha256,
        cache_dir=download_cache,
    )


def fetch_task(cache_dir: str | Path, dest: Path) -> Task[..., FetchResult]:
    """``fetch_source`` with its cache records kept under ``cache_dir``.

    Runs that fetch the same pinned source at the same time are serialised by
    :func:`h5forge.fetch.sources.fetch` itself (an OS file lock on the destination folder, released
    by the kernel when its holder dies): the second waits for the first and then reuses the
    complete extraction instead of extracting into the same folder concurrently. (Not a
    Prefect SERIALIZABLE cache lock: ``FileSystemLockManager`` writes its locks without expiry,
    so a run killed while fetching left a lock that made every later run wait forever — found
    by the crash campaign, docs/RELIABILITY.md.) A cache entry whose extracted folder has since
    been deleted is refreshed instead of returning a path that no longer exists.
    """
    cache = Path(cache_dir)
    return fetch_source.with_options(
        result_storage=cache / "prefect-results",
        refresh_cache=not dest.is_dir(),
    )

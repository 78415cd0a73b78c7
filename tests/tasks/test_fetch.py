"""The fetch task: cache key, cache folder life cycle, and which failures are retried."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prefect import flow
from prefect.serializers import JSONSerializer
from prefect.states import Failed

from h5forge.demo import write_image_folder
from h5forge.errors import ChecksumError, UnsafeArchiveError
from h5forge.fetch.sources import FetchResult
from h5forge.location import Location
from h5forge.tasks.common import retry_if_transient, retry_upload
from h5forge.tasks.fetch import _fetch_cache_key, fetch_source, fetch_task, source_dir
from tests.fixtures.prefect import flow_run_task_runs

SHA = "ab" * 32


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("archive-src")
    write_image_folder(root / "data", classes=("a", "b"), per_class=2)
    return Path(shutil.make_archive(str(root / "data"), "gztar", root, "data"))


def _key(
    source: str, sha256: str | None, dest: str = "/cache/x", options: dict[str, str] | None = None
) -> str | None:
    params = {"source": Location(source, options), "sha256": sha256, "dest": dest}
    return _fetch_cache_key(None, params)  # type: ignore[arg-type]


def test_cache_key_pins_url_and_checksum_and_ignores_credentials() -> None:
    assert _key("https://h/x.tgz", None) is None  # an unpinned URL is never cached
    plain = _key("https://h/x.tgz", SHA)
    assert plain is not None
    assert _key("https://user:pw@h/x.tgz", SHA) == plain
    signed = "https://h/x.tgz?X-Amz-Signature="
    assert _key(signed + "1", SHA) == _key(signed + "2", SHA)
    rotated = [{"key": "AKIA1", "secret": "one"}, {"key": "AKIA2", "secret": "two"}]
    assert _key("https://h/x.tgz", SHA, options=rotated[0]) == plain
    assert _key("https://h/x.tgz", SHA, options=rotated[1]) == plain
    assert _key("https://h/x.tgz", SHA.upper()) == plain
    assert _key("https://h/x.tgz", "cd" * 32) != plain
    assert _key("https://h/y.tgz", SHA) != plain


def test_source_dir_is_stable_per_pinned_source(tmp_path: Path) -> None:
    assert source_dir(tmp_path, "/a.tgz", None) is None
    first = source_dir(tmp_path, "/a.tgz", SHA)
    assert first == source_dir(tmp_path, "/a.tgz", SHA.upper())
    assert first != source_dir(tmp_path, "/b.tgz", SHA)
    assert first is not None
    assert first.parent == tmp_path / "sources"


def test_fetch_task_function_extracts_the_archive(archive: Path, tmp_path: Path) -> None:
    got = fetch_source.fn(
        Location.of(archive), dest=str(tmp_path / "src"), sha256=Location.of(archive).sha256()
    )
    assert isinstance(got, FetchResult)
    assert sorted(p.name for p in Path(got.root).iterdir()) == ["a", "b"]
    assert got.sha256 == Location.of(archive).sha256()
    assert JSONSerializer().loads(JSONSerializer().dumps(got)) == got  # the cached result


def test_fetch_task_function_rejects_a_wrong_checksum(archive: Path, tmp_path: Path) -> None:
    with pytest.raises(ChecksumError):
        fetch_source.fn(Location.of(archive), dest=str(tmp_path / "src"), sha256=SHA)


@pytest.mark.parametrize(
    ("exc", "retried"),
    [
        (ConnectionResetError("peer reset"), True),
        (TimeoutError("read timed out"), True),
        (OSError("503 Slow Down"), True),
        (ChecksumError("digest differs"), False),
        (UnsafeArchiveError("download over max_bytes"), False),
        (FileNotFoundError("no such object"), False),
        (PermissionError("403"), False),
        (ValueError("bad argument"), False),
    ],
)
def test_only_transient_failures_are_retried(exc: Exception, retried: bool) -> None:
    assert retry_if_transient(None, None, Failed(data=exc)) is retried  # type: ignore[arg-type]


def test_a_damaged_upload_is_retried_but_a_bad_argument_is_not() -> None:
    damaged = Failed(data=ChecksumError("read-back differs"))
    assert retry_upload(None, None, damaged) is True  # type: ignore[arg-type]
    assert retry_upload(None, None, Failed(data=ValueError("bad"))) is False  # type: ignore[arg-type]


@flow
def _fetch_twice(source: str, sha256: str, cache: str, delete_between: bool) -> list[str]:
    states = []
    for attempt in range(2):
        dest = source_dir(cache, source, sha256)
        assert dest is not None
        if delete_between and attempt == 1:
            shutil.rmtree(dest)
        # Other options each time (rotated credentials): the cache key holds none of them.
        where = Location(source, {"auto_mkdir": bool(attempt)})
        state = fetch_task(cache, dest)(where, dest=str(dest), sha256=sha256, return_state=True)
        assert Path(state.result().root).is_dir()
        states.append(state.name)
    return states


@pytest.mark.parametrize(
    ("delete_between", "expected"),
    [(False, ["Completed", "Cached"]), (True, ["Completed", "Completed"])],
)
def test_second_fetch_is_cached_unless_its_folder_is_gone(
    prefect_harness: str,
    archive: Path,
    tmp_path: Path,
    delete_between: bool,
    expected: list[str],
) -> None:
    states = _fetch_twice(
        str(archive), Location.of(archive).sha256(), str(tmp_path / "cache"), delete_between
    )
    assert states == expected


@flow
def _fetch_missing(source: str, dest: str) -> None:
    fetch_source(Location(source), dest=dest)


def test_a_missing_source_fails_at_once_without_retries(
    prefect_harness: str, tmp_path: Path
) -> None:
    state = _fetch_missing(
        str(tmp_path / "absent.tar.gz"), str(tmp_path / "dest"), return_state=True
    )
    assert state.is_failed()
    with pytest.raises(FileNotFoundError):
        state.result()
    [run] = flow_run_task_runs(state.state_details.flow_run_id)
    assert run.run_count == 1
    assert run.name == "fetch[absent.tar.gz]"

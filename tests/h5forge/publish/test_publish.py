"""publish(): the same tests on file://, memory:// and s3:// (moto on loopback).

Each backend reports the order in which final names were written and deleted, observed at the
storage itself: the S3 server's request log, the memory store's own dict, and for local files
an audit hook on ``os.rename``/``os.remove`` (publish renames temp files into place).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from h5forge.errors import ChecksumError
from h5forge.location import Location
from h5forge.publish.sidecar import read_sidecar, sidecar_url
from h5forge.publish.storage import publish

Event = tuple[str, str]  # ("write" | "delete" | "read", basename)

SECRET_SOURCE = "https://alice:pwsecret@example.org/set.tar?X-Amz-Signature=sigsecret&v=2"


@dataclass
class Backend:
    name: str
    base: str
    options: dict[str, Any]
    events: Callable[[], list[Event]]
    clear: Callable[[], None]

    def fs(self) -> Any:
        return fsspec.core.url_to_fs(self.base, **self.options)[0]


_recording: list[Event] | None = None
_audit_installed = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _recording is None:
        return
    if event == "os.rename":
        _recording.append(("write", os.path.basename(os.fsdecode(args[1]))))
    elif event == "os.remove":
        _recording.append(("delete", os.path.basename(os.fsdecode(args[0]))))


class _RecordingStore(dict[str, Any]):
    def __init__(self, initial: dict[str, Any], log: list[Event]) -> None:
        super().__init__(initial)
        self.log = log

    def __setitem__(self, key: str, value: Any) -> None:
        self.log.append(("write", posixpath.basename(key)))
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.log.append(("delete", posixpath.basename(key)))
        super().__delitem__(key)


def _s3_events(log: Callable[[], list[Any]]) -> list[Event]:
    out: list[Event] = []
    for method, path, _range in log():
        name = posixpath.basename(path.split("?", 1)[0])
        op = {"PUT": "write", "DELETE": "delete", "GET": "read"}.get(method)
        if op and "?" not in path.replace("?x-id=PutObject", ""):
            out.append((op, name))
    return out


@pytest.fixture(params=["file", "memory", "s3"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    global _recording, _audit_installed
    log: list[Event] = []
    if request.param == "file":
        if not _audit_installed:  # audit hooks cannot be removed: install one, switch it
            sys.addaudithook(_audit)
            _audit_installed = True
        _recording = log
        try:
            yield Backend("file", (tmp_path / "pub").as_uri(), {}, lambda: list(log), log.clear)
        finally:
            _recording = None
    elif request.param == "memory":
        monkeypatch.setattr(MemoryFileSystem, "store", _RecordingStore(MemoryFileSystem.store, log))
        base = f"memory://h5forge-pub-{uuid.uuid4().hex[:8]}"
        yield Backend("memory", base, {}, lambda: list(log), log.clear)
    else:
        bucket = request.getfixturevalue("s3_bucket")
        options = request.getfixturevalue("s3_storage_options")
        s3_log = request.getfixturevalue("s3_requests")
        yield Backend(
            "s3", f"s3://{bucket}/assets", options, lambda: _s3_events(s3_log), s3_log.clear
        )


@pytest.fixture
def asset(tmp_path: Path) -> Path:
    path = tmp_path / "local" / "set.h5"
    path.parent.mkdir()
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(50_000))
    return path


def _writes(events: list[Event]) -> list[str]:
    return [name for op, name in events if op == "write" and not name.startswith(".")]


def test_publish_writes_file_then_sidecar(backend: Backend, asset: Path):
    url = f"{backend.base}/v1/set.h5"
    extra = {"counts": {"train": {"cat": 3, "key": 2}}, "source": SECRET_SOURCE, "token": "t0k"}

    result = publish(asset, url, storage_options=backend.options, extra=extra)

    data = asset.read_bytes()
    assert (result.sha256, result.bytes, result.unchanged) == (
        hashlib.sha256(data).hexdigest(),
        len(data),
        False,
    )
    assert result.sidecar_url == sidecar_url(url) == url + ".manifest.json"
    fs = backend.fs()
    assert fs.cat_file(fsspec.core.url_to_fs(url, **backend.options)[1]) == data
    sidecar = read_sidecar(url, storage_options=backend.options)
    assert sidecar["sha256"] == result.sha256
    assert sidecar["bytes"] == len(data)
    assert sidecar["format"] == "h5forge"
    assert sidecar["format_version"] == 1
    assert sidecar["counts"] == extra["counts"]  # a class named "key" is not a secret
    assert sidecar["source"] == "https://example.org/set.tar?X-Amz-Signature=REDACTED&v=2"
    assert sidecar["created_at"].endswith("+00:00")
    raw = json.dumps(sidecar)
    for secret in ("pwsecret", "sigsecret", "t0k", "alice"):
        assert secret not in raw
    events = backend.events()
    assert _writes(events)[-2:] == ["set.h5", "set.h5.manifest.json"]
    if backend.name == "s3":  # read back from the server between upload and sidecar
        order = [e for e in events if e[1] == "set.h5" or e[0] == "write"]
        upload = order.index(("write", "set.h5"))
        assert ("read", "set.h5") in order[upload : order.index(("write", "set.h5.manifest.json"))]
    folder = fsspec.core.url_to_fs(f"{backend.base}/v1", **backend.options)[1]
    listing = sorted(posixpath.basename(p) for p in fs.ls(folder, detail=False))
    assert listing == ["set.h5", "set.h5.manifest.json"]  # no temp files left


def test_identical_republish_is_a_noop(backend: Backend, asset: Path):
    url = f"{backend.base}/set.h5"
    first = publish(asset, url, storage_options=backend.options)
    backend.clear()

    again = publish(asset, url, storage_options=backend.options)

    assert again.unchanged
    assert again.sha256 == first.sha256
    assert [e for e in backend.events() if e[0] != "read"] == []


def test_different_content_needs_overwrite(backend: Backend, asset: Path, tmp_path: Path):
    url = f"{backend.base}/set.h5"
    publish(asset, url, storage_options=backend.options)
    old_sidecar = read_sidecar(url, storage_options=backend.options)
    newer = tmp_path / "newer.h5"
    newer.write_bytes(b"\x89HDF\r\n\x1a\n" + os.urandom(30_000))

    with pytest.raises(FileExistsError, match=r"set\.h5.*overwrite=True"):
        publish(newer, url, storage_options=backend.options)
    assert Location.of(url, backend.options).sha256() == old_sidecar["sha256"]
    assert read_sidecar(url, storage_options=backend.options) == old_sidecar

    backend.clear()
    result = publish(newer, url, storage_options=backend.options, overwrite=True)

    assert not result.unchanged
    assert Location.of(url, backend.options).sha256() == result.sha256
    assert read_sidecar(url, storage_options=backend.options)["sha256"] == result.sha256
    events = [e for e in backend.events() if not e[1].startswith(".")]
    first_file_write = events.index(("write", "set.h5"))
    assert ("delete", "set.h5.manifest.json") in events[:first_file_write]
    assert _writes(events)[-1] == "set.h5.manifest.json"


def test_file_without_sidecar(backend: Backend, asset: Path, tmp_path: Path):
    """An interrupted publish (file, no sidecar) is completed; other content is refused."""
    url = f"{backend.base}/set.h5"
    fs, path = fsspec.core.url_to_fs(url, **backend.options)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.put_file(str(asset), path)

    result = publish(asset, url, storage_options=backend.options)
    assert read_sidecar(url, storage_options=backend.options)["sha256"] == result.sha256

    fs.rm_file(path + ".manifest.json")
    other = tmp_path / "other.h5"
    other.write_bytes(b"other")
    with pytest.raises(FileExistsError, match="no sidecar"):
        publish(other, url, storage_options=backend.options)


def test_read_back_mismatch_deletes_object(asset: Path, monkeypatch: pytest.MonkeyPatch):
    """Fault injection at the store: it silently stores flipped bytes."""
    base = f"/h5forge-pub-{uuid.uuid4().hex[:8]}"
    honest = MemoryFileSystem.put_file

    def flipping_put(self: MemoryFileSystem, lpath: str, rpath: str, **kw: Any) -> None:
        honest(self, lpath, rpath, **kw)
        data = bytearray(self.cat_file(rpath))
        data[100] ^= 0xFF
        self.pipe_file(rpath, bytes(data))

    monkeypatch.setattr(MemoryFileSystem, "put_file", flipping_put)
    fs = fsspec.filesystem("memory")
    try:
        with pytest.raises(ChecksumError, match="read-back") as info:
            publish(asset, f"memory://{base}/set.h5")
        assert hashlib.sha256(asset.read_bytes()).hexdigest() in str(info.value)
        assert not fs.exists(f"{base}/set.h5")
        assert not fs.exists(f"{base}/set.h5.manifest.json")
    finally:
        if fs.exists(base):
            fs.rm(base, recursive=True)


def test_sidecar_errors(tmp_path: Path, asset: Path):
    url = (tmp_path / "x.h5").as_uri()
    with pytest.raises(FileNotFoundError, match="not published"):
        read_sidecar(url)
    (tmp_path / "x.h5.manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_sidecar(url)
    (tmp_path / "x.h5.manifest.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not an h5forge sidecar"):
        read_sidecar(url + ".manifest.json")
    with pytest.raises(ValueError, match="publish computes itself"):
        publish(asset, url, extra={"sha256": "0" * 64})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        publish(tmp_path / "absent.h5", url)
    assert sidecar_url("https://h/x.h5?sig=1") == "https://h/x.h5.manifest.json?sig=1"


def test_an_oversized_sidecar_is_refused_after_a_bounded_read(backend: Backend) -> None:
    from h5forge.location import MAX_SIDECAR_BYTES

    url = f"{backend.base}/big.h5"
    fs, path = fsspec.core.url_to_fs(sidecar_url(url), **backend.options)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    # Valid JSON at its start, so only the bound can refuse it.
    body = b'{"format": "h5forge", "pad": "' + b"x" * (MAX_SIDECAR_BYTES + 4096) + b'"}'
    size = len(body)
    fs.pipe_file(path, body)
    with pytest.raises(ValueError, match=rf"big\.h5\.manifest\.json.* is {size} bytes, over"):
        read_sidecar(url, storage_options=backend.options)


def test_the_old_public_name_read_manifest_fails_naming_read_sidecar() -> None:
    import h5forge

    with pytest.raises(
        ImportError, match=r"h5forge\.read_manifest was renamed h5forge\.read_sidecar"
    ):
        from h5forge import read_manifest  # noqa: F401
    with pytest.raises(ImportError, match="read_sidecar"):
        _ = h5forge.read_manifest
    assert h5forge.read_sidecar is read_sidecar

"""Location: one value for where bytes live (URL + storage options), on disk and on loopback S3."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest

from h5forge.documents import MAX_JSON_DEPTH, DocumentError
from h5forge.errors import IntegrityError
from h5forge.location import Location

_SECRET = "do-not-print-me-7c1"


def test_it_pickles_as_url_and_options_without_its_filesystem(tmp_path: Path) -> None:
    where = Location.of(tmp_path / "a.h5", {"auto_mkdir": True})
    assert where.is_local  # resolves the filesystem
    assert "_resolved" in vars(where)

    back = pickle.loads(pickle.dumps(where))

    assert back == where
    assert (back.url, back.options) == (str(tmp_path / "a.h5"), {"auto_mkdir": True})
    assert "_resolved" not in vars(back)  # each process resolves its own
    assert back.path == where.path


def test_it_prints_the_redacted_url_and_never_its_options() -> None:
    url = "https://user:pw@host/data.h5?X-Amz-Signature=abc&v=1"
    where = Location.of(url, {"secret": _SECRET, "key": "AKIA"})

    for shown in (str(where), repr(where), f"{where}", str([where])):
        assert _SECRET not in shown
        assert "AKIA" not in shown
        assert "pw" not in shown
        assert "host/data.h5" in shown
    assert str(where) == "https://host/data.h5?X-Amz-Signature=REDACTED&v=1"
    assert where.key == "https://host/data.h5?v=1"  # canonical: signature dropped, not masked
    assert Location.of("s3://B/x?X-Amz-Signature=1").key == Location.of("s3://B/x").key.lower()


def test_it_is_immutable_and_refuses_options_twice() -> None:
    where = Location.of("memory://a/b.h5", {"anon": True})
    with pytest.raises(AttributeError, match="immutable"):
        where.url = "memory://other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        where.options["anon"] = False  # type: ignore[index]
    assert Location.of(where) is where
    with pytest.raises(ValueError, match="carries its own storage options"):
        Location.of(where, {"key": "k"})
    assert Location.of("memory://a/b.h5", {"anon": True}) == where
    assert Location.of("memory://a/b.h5", {"anon": False}) != where
    with pytest.raises(ValueError, match="non-empty URL"):
        Location.of("")


def test_siblings_and_children_keep_the_options_and_the_query() -> None:
    opts = {"anon": True}
    signed = Location.of("https://h/x.h5?sig=1", opts)
    assert signed.sidecar.url == "https://h/x.h5.manifest.json?sig=1"
    assert signed.sibling(".preview.png").url == "https://h/x.h5.preview.png?sig=1"
    assert signed.sidecar.options == opts
    folder = Location.of("s3://bucket/set/", opts)
    assert folder.join("v", "a.h5").url == "s3://bucket/set/v/a.h5"
    assert folder.join("v").options == opts
    assert Location.of("/data/set").join("v").url == "/data/set/v"


def test_only_local_files_are_local(tmp_path: Path) -> None:
    assert Location.of(tmp_path).is_local
    assert Location.of(f"file://{tmp_path}").is_local
    assert not Location.of("memory://x/y").is_local


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"x" * 101, "is 101 bytes, over 100 bytes"),
        (b"{not json", "is not JSON"),
        (b"\xff\xfe", "is not JSON"),
        (
            b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1),
            "is not JSON h5forge reads: it nests more than 32 levels deep",
        ),
    ],
)
@pytest.mark.parametrize("store", ["local", "memory"])
def test_read_json_refuses_what_h5forge_did_not_write(
    tmp_path: Path, store: str, body: bytes, words: str
) -> None:
    where = _at(tmp_path, store, "doc.json")
    where.put(data=body)
    with pytest.raises(DocumentError, match=rf"test document '.*doc\.json' {words}"):
        where.read_json(limit=100, what="test document")


def test_read_json_reads_what_is_within_its_bounds(tmp_path: Path) -> None:
    deep: Any = "leaf"
    for _ in range(MAX_JSON_DEPTH - 1):  # inside the outer object: exactly the bound
        deep = [deep]
    body = {"nested": deep, "text": "[[[[" * 50, "n": 1}  # brackets in strings do not nest
    where = Location.of(tmp_path / "doc.json")
    where.put(data=json.dumps(body).encode())
    assert where.read_json(limit=1 << 20, what="test document")["nested"] == body["nested"]
    with pytest.raises(FileNotFoundError):
        Location.of(tmp_path / "absent.json").read_json(limit=100, what="test document")


def test_read_json_never_waits_on_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "doc.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            Location.of(fifo).read_json(limit=100, what="test document")
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    if reader.is_alive():  # unblock the reader so the test process can exit
        with open(fifo, "wb"):
            pass
        pytest.fail("read_json blocked on a FIFO")
    assert isinstance(outcome[0], DocumentError)
    assert "not a regular file" in str(outcome[0])


def _at(tmp_path: Path, store: str, name: str) -> Location:
    if store == "local":
        return Location.of(tmp_path / name)
    return Location.of(f"memory://{tmp_path.name}/{name}")


def test_put_replaces_atomically_and_sha256_streams_on_disk(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(3 * 1024 + 7)
    src.write_bytes(data)
    target = tmp_path / "out" / "dst.bin"
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    target.parent.mkdir()
    target.symlink_to(victim)  # a planted link is replaced, never written through

    Location.of(target).put(local=src)

    assert target.read_bytes() == data
    assert not target.is_symlink()
    assert victim.read_bytes() == b"keep"
    assert sorted(p.name for p in target.parent.iterdir()) == ["dst.bin"]  # no temp left
    digest = hashlib.sha256(data).hexdigest()
    assert Location.of(target).sha256() == digest
    assert Location.of(target).sha256(chunk=1000) == digest
    with pytest.raises(ValueError, match="exactly one"):
        Location.of(target).put()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer ever comes: an open that waits for one hangs the test
    with pytest.raises(ValueError, match="is not a regular file"):
        Location.of(fifo).sha256()


def test_put_and_sha256_on_loopback_s3(
    s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(100_000)
    src.write_bytes(data)
    where = Location.of(f"s3://{s3_bucket}/dir/a.bin", s3_storage_options)
    assert not where.is_local

    where.put(local=src)
    where.sidecar.put(data=b'{"n": 1}')

    assert where.sha256() == hashlib.sha256(data).hexdigest()
    assert where.sidecar.read_json(limit=100, what="test document") == {"n": 1}
    where.sidecar.put(data=b"y" * 200)
    with pytest.raises(DocumentError, match="is 200 bytes, over 100 bytes"):
        where.sidecar.read_json(limit=100, what="test document")
    back = pickle.loads(pickle.dumps(where))
    assert back.sha256() == where.sha256()


@pytest.mark.parametrize(
    ("told", "how"), [(None, None), (1010, "fewer"), (990, "more"), (0, "more")]
)
def test_a_download_takes_exactly_the_bytes_it_is_told_or_refuses(
    s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path, told: int | None, how: str
) -> None:
    # A rewrite copies a shard by the size its manifest records; the store may hold another.
    data = os.urandom(1000)
    where = Location.of(f"s3://{s3_bucket}/a.bin", s3_storage_options)
    where.put(data=data)
    local = tmp_path / "a.bin"
    fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    if how is None:
        assert where.download(fd, size=told) == hashlib.sha256(data).hexdigest()
        assert local.read_bytes() == data
        return
    with pytest.raises(IntegrityError, match=f"the store has {how} bytes in .* than the {told}"):
        where.download(fd, size=told)
    assert len(local.read_bytes()) <= min(told, len(data))  # never a byte past what was told


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_worker_builds_its_s3_client_from_the_models_its_parent_loaded(
    s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    """botocore's models (~0.15 s of CPU to load) are loaded once per process tree: a forked
    worker's new filesystem gets a session of its own that reads them from the inherited data
    loader. Never the parent's session or client, and never in the pickled options."""
    where = Location.of(f"s3://{s3_bucket}/a.bin", s3_storage_options)
    where.fs.pipe(where.path, b"abc")
    parent_session = where.fs.session
    loader = parent_session.get_component("data_loader")
    assert loader._cache  # the parent's client loaded the models into it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never raise past os._exit
        ok = b"0"
        try:
            child = Location.of(f"s3://{s3_bucket}/a.bin", s3_storage_options)
            fs = child.fs
            ok = b"".join(
                [
                    b"1" if fs.session is not parent_session else b"0",
                    b"1" if fs.session.get_component("data_loader") is loader else b"0",
                    b"1" if fs.cat(child.path) == b"abc" else b"0",
                ]
            )
        finally:
            os.write(write, ok)
            os._exit(0)
    os.close(write)
    answer = os.read(read, 16)
    os.waitpid(pid, 0)
    assert answer == b"111"  # its own session, the inherited models, a working client
    # Pickled, the filesystem and the location carry the options only: no session.
    clone = pickle.loads(pickle.dumps(where.fs))
    assert clone.cat(where.path) == b"abc"
    assert "session" not in pickle.loads(pickle.dumps(where)).options


def test_s3_options_that_make_a_session_keep_their_own(
    s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    own = Location.of(f"s3://{s3_bucket}/a.bin", {**s3_storage_options, "profile": "other"})
    assert own.fs.session is None  # s3fs makes it, with the profile, at the first request
    shared = Location.of(f"s3://{s3_bucket}/b.bin", s3_storage_options)
    assert shared.fs.session is not None

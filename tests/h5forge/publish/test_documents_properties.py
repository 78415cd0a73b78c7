"""Property tests of publish's readers of untrusted documents (issues 28 and 29): the pointer,
the published sidecar, the sources map and the version manifest. Whatever lies under a
document's name (any bytes, any JSON, a mutated real document, nesting past the bound, a FIFO,
a folder, a device), the reader returns or raises its one documented error (``ValueError``, of
which ``DocumentError`` and ``IntegrityError`` are two), never another exception and never a
hang. A valid manifest round-trips through its canonical bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5forge.location import Location
from h5forge.publish.lineage import SOURCES_FORMAT, read_sources, sources_url
from h5forge.publish.manifest import (
    MANIFEST_SUFFIX,
    ShardEntry,
    VersionManifest,
    manifest_bytes,
    parse_manifest,
    read_manifest,
)
from h5forge.publish.sidecar import FORMAT_NAME, load_sidecar, read_sidecar
from h5forge.publish.versions import (
    POINTER_FORMAT,
    Pointer,
    pointer_url,
    read_pointer,
    version_url,
)
from tests.fixtures.documents import (
    TEXT,
    attempt,
    document_bytes,
    examples,
    place,
    placed_documents,
)

SHA = "ab" * 32
POINTER = {
    "format": POINTER_FORMAT,
    "format_version": 1,
    "name": "flowers",
    "sha256": SHA,
    "path": f"v/{SHA[:16]}/flowers.h5",
    "published_at": "2026-01-01T00:00:00+00:00",
    "parent": "",
}
SIDECAR = {
    "format": FORMAT_NAME,
    "format_version": 2,
    "sha256": SHA,
    "bytes": 1234,
    "counts": {"train": {"a": 3}},
    "created_at": "2026-01-01T00:00:00+00:00",
    "source": "s3://bucket/x",
    "num_samples": 3,
    "num_classes": 1,
}
SOURCES = {"format": SOURCES_FORMAT, "format_version": 1, "files": {"a/1.jpg": SHA}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("publish-documents")


@examples(100)
@given(content=placed_documents(POINTER))
def test_the_pointer_reads_or_raises_value_error(folder: Path, content: bytes | str) -> None:
    asset = str(folder / "flowers.h5")
    place(Path(pointer_url(asset)), content)
    pointer, error = attempt(lambda: read_pointer(Location(asset)), ValueError)
    if error is not None:
        return
    assert isinstance(pointer, Pointer)  # a file is there: never None
    assert pointer.url == version_url(asset, pointer.sha256)  # the address is recomputed


@examples(100)
@given(content=placed_documents(SIDECAR))
def test_a_published_sidecar_reads_or_raises_value_error(
    folder: Path, content: bytes | str
) -> None:
    asset = folder / "asset.h5"
    place(Path(Location(str(asset)).sidecar.path), content)
    loaded, error = attempt(lambda: load_sidecar(Location(str(asset)).sidecar), ValueError)
    if error is None:
        assert isinstance(loaded, dict)
        assert isinstance(loaded["bytes"], int)
    read, read_error = attempt(lambda: read_sidecar(str(asset)), ValueError)
    assert read == loaded
    assert (read_error is None) == (error is None)


@examples(100)
@given(content=placed_documents(SOURCES))
def test_a_sources_map_reads_or_raises_value_error(folder: Path, content: bytes | str) -> None:
    version = folder / "v" / SHA[:16] / "flowers.h5"
    place(Path(sources_url(str(version))), content)
    files, error = attempt(lambda: read_sources(Location(str(version))), ValueError)
    if error is not None:
        return
    assert isinstance(files, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())


# --------------------------------------------------------------------------- version manifests

_HEX = "0123456789abcdef"
_SHA = st.text(alphabet=_HEX, min_size=64, max_size=64)
MANIFEST = json.loads(
    manifest_bytes(
        VersionManifest(
            name="flowers",
            classes=("a", "b"),
            shards=(
                ShardEntry(SHA, 100, "cd" * 32, 3, (1,), (0, -1), {"train": 2}),
                ShardEntry("ef" * 32, 50, "01" * 32, 2, (), (1,), {}),
            ),
            created_at="2026-01-01T00:00:00+00:00",
            parent="12" * 32,
            lineage={"flow_run_id": "x"},
        )
    )
)


@examples(100)
@given(content=placed_documents(MANIFEST))
def test_a_version_manifest_reads_or_raises_value_error(folder: Path, content: bytes | str) -> None:
    where = folder / "v" / SHA[:16] / f"flowers{MANIFEST_SUFFIX}"
    place(where, content)
    manifest, error = attempt(lambda: read_manifest(Location(str(where))), ValueError)
    if error is not None:
        return
    assert isinstance(manifest, VersionManifest)
    assert manifest.num_samples == sum(s.samples - len(s.deleted) for s in manifest.shards)
    assert all(-1 <= v < len(manifest.classes) for s in manifest.shards for v in s.labels)
    assert all(0 <= r < s.samples for s in manifest.shards for r in s.deleted)


@examples(100)
@given(data=document_bytes(MANIFEST) | st.binary(max_size=256))
def test_any_bytes_parse_as_a_manifest_or_raise_value_error(data: bytes) -> None:
    manifest, _ = attempt(lambda: parse_manifest(data, shown="m"), ValueError)
    assert manifest is None or isinstance(manifest, VersionManifest)


@st.composite
def _entries(draw: st.DrawFn, num_classes: int) -> ShardEntry:
    samples = draw(st.integers(0, 40))
    deleted = sorted(draw(st.sets(st.integers(0, max(0, samples - 1)), max_size=samples)))
    deleted = [r for r in deleted if r < samples]
    live = samples - len(deleted)
    names = draw(st.lists(TEXT, unique=True, max_size=3))
    counts = draw(st.lists(st.integers(0, live), min_size=len(names), max_size=len(names)))
    splits, left = {}, live
    for name, count in zip(names, counts, strict=True):
        splits[name], left = min(count, left), left - min(count, left)
    return ShardEntry(
        sha256=draw(_SHA),
        bytes=draw(st.integers(0, 2**50)),
        metadata_sha256=draw(_SHA),
        samples=samples,
        deleted=tuple(deleted),
        labels=tuple(draw(st.lists(st.integers(-1, num_classes - 1), max_size=num_classes + 1))),
        splits=splits,
    )


@st.composite
def _manifests(draw: st.DrawFn) -> VersionManifest:
    classes = tuple(draw(st.lists(TEXT, unique=True, max_size=6)))
    return VersionManifest(
        name=draw(st.text(alphabet="abcxyz-_.0", min_size=1, max_size=12).filter(
            lambda n: n not in (".", "..")
        )),
        classes=classes,
        shards=tuple(draw(st.lists(_entries(len(classes)), max_size=4))),
        config_json=draw(TEXT),
        config_sha256=draw(TEXT),
        source_url=draw(TEXT),
        source_fingerprint=draw(TEXT),
        created_at=draw(TEXT),
        h5forge_version=draw(TEXT),
        parent=draw(st.just("") | _SHA),
        lineage=draw(st.dictionaries(TEXT, TEXT, max_size=3)),
    )  # fmt: skip


@examples(100)
@given(manifest=_manifests())
def test_a_valid_manifest_round_trips_through_its_canonical_bytes(
    manifest: VersionManifest,
) -> None:
    data = manifest_bytes(manifest)
    assert parse_manifest(data, shown="m") == manifest
    assert manifest_bytes(parse_manifest(data, shown="m")) == data  # canonical: one spelling

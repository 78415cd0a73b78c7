"""Property tests of publish's readers of untrusted documents (issue 28): the pointer, the
published sidecar and the sources map. Whatever lies under a document's name (any bytes, any
JSON, a mutated real document, nesting past the bound, a FIFO, a folder, a device), the reader
returns or raises its one documented error (``ValueError``, of which ``DocumentError`` is one),
never another exception and never a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given

from h5forge.location import Location
from h5forge.publish.lineage import SOURCES_FORMAT, read_sources, sources_url
from h5forge.publish.sidecar import FORMAT_NAME, load_sidecar, read_sidecar
from h5forge.publish.versions import (
    POINTER_FORMAT,
    Pointer,
    pointer_url,
    read_pointer,
    version_url,
)
from tests.fixtures.documents import attempt, examples, place, placed_documents

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

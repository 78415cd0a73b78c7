"""``h5forge.tasks.verify``: a failed check emits ``h5forge.verify.failed`` (resource: the
asset's key, payload: the failures) before it fails the task; a file that verifies emits nothing."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import h5py
import pytest
from prefect import flow

from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS, ImageConfig
from h5forge.tasks.publish import asset_key
from h5forge.tasks.verify import VERIFY_FAILED, check_sidecar, verify_file
from h5forge.verify.checks import verify

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("images")
    write_image_folder(root, classes=["cat", "dog"], per_class=6)
    out = tmp_path_factory.mktemp("packed") / "small.h5"
    config = PackConfig(ImageConfig(resize="resize", size=(16, 16)))
    return Path(pack(root, out, config=config, workers=1).path)


@flow(name="verify-events-test")
def _verify_in_a_flow(path: str, asset: str | None = None) -> None:
    verify_file(path, asset=asset, max_pixels=DEFAULT_MAX_PIXELS)


@flow(name="check-sidecar-events-test")
def _check_in_a_flow(path: str, sidecar: dict[str, Any]) -> None:
    check_sidecar(path, sidecar=sidecar, report=verify(path))


def _events(resource_id: str, *, wait_s: float, want: int = 1) -> list[Any]:
    """``h5forge.verify.failed`` events of ``resource_id`` on the server, waiting up to
    ``wait_s`` for ``want`` of them (events reach the server through a background worker)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    event_filter = EventFilter(
        event=EventNameFilter(name=[VERIFY_FAILED]),
        resource=EventResourceFilter(id=[resource_id]),
    )

    async def read() -> list[Any]:
        async with get_client() as client:
            return list((await client.read_events(filter=event_filter, limit=50)).events)

    deadline = time.monotonic() + wait_s
    while True:
        events = asyncio.run(read())
        if len(events) >= want or time.monotonic() > deadline:
            return events
        time.sleep(0.25)


def _flip_sample(path: Path, index: int) -> None:
    with h5py.File(path, "r") as h5:
        offset = int(h5["byte_ranges"][index, 0])
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\x00\xff\x00")


def test_a_failed_verify_emits_the_event_with_the_failures(
    prefect_harness: str, packed: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.h5"
    broken.write_bytes(packed.read_bytes())
    _flip_sample(broken, 3)
    asset = "s3://user:secret@bucket/published/small.h5"  # what the file is to become

    with pytest.raises(IntegrityError, match="sample 3"):
        _verify_in_a_flow(str(broken), asset=asset)

    (event,) = _events("s3://bucket/published/small.h5", wait_s=20)
    assert "secret" not in event.model_dump_json()
    assert event.payload["check"] == "verify"
    assert event.payload["num_failures"] == len(event.payload["failures"]) >= 1
    assert any("sample 3" in line for line in event.payload["failures"])


def test_a_sidecar_mismatch_emits_the_event_for_the_asset(
    prefect_harness: str, packed: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy.h5"
    copy.write_bytes(packed.read_bytes())
    sidecar = {"format": "h5forge", "sha256": "0" * 64, "bytes": copy.stat().st_size}

    with pytest.raises(IntegrityError):
        _check_in_a_flow(str(copy), sidecar)

    (event,) = _events(asset_key(str(copy)), wait_s=20)
    assert event.resource["prefect.resource.id"].startswith("file:///")
    assert event.payload["check"] == "sidecar"
    assert any("sha256" in line for line in event.payload["failures"])


def test_a_file_that_verifies_emits_nothing(prefect_harness: str, packed: Path) -> None:
    _verify_in_a_flow(str(packed))
    assert _events(asset_key(str(packed)), wait_s=3) == []

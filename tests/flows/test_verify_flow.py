"""``verify-h5-asset``: re-verify published assets against their sidecars."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import h5py
import pytest

from h5forge.errors import IntegrityError
from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.flows.verify import verify_asset

pytestmark = pytest.mark.slow


@pytest.fixture
def copy_of_asset(built: Any, tmp_path: Path) -> Path:
    """A private copy of the demo asset and its sidecar, free to tamper with."""
    dest = tmp_path / "demo.h5"
    shutil.copyfile(built.dest, dest)
    shutil.copyfile(str(built.dest) + ".manifest.json", str(dest) + ".manifest.json")
    return dest


def test_a_published_asset_verifies_against_its_sidecar(built: Any) -> None:
    state = verify_asset(str(built.dest), return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result["sha256"] == built.summary.sha256
    assert result["bytes"] == built.summary.bytes
    assert 0 < result["checked_samples"] < result["num_samples"] == 300


def test_a_flipped_byte_fails_the_run(copy_of_asset: Path) -> None:
    with h5py.File(copy_of_asset, "r") as h5:
        offset = int(h5["byte_ranges"][7, 0])
    with open(copy_of_asset, "r+b") as f:
        f.seek(offset)
        f.write(b"\x00\xff\x00")
    state = verify_asset(str(copy_of_asset), sample_fraction=1.0, return_state=True)
    assert state.is_failed()
    with pytest.raises(IntegrityError, match="sample 7"):
        state.result()


def test_a_sidecar_that_disagrees_with_the_file_fails_the_run(copy_of_asset: Path) -> None:
    sidecar_path = Path(str(copy_of_asset) + ".manifest.json")
    sidecar = json.loads(sidecar_path.read_text())
    sidecar["sha256"] = "0" * 64
    sidecar_path.write_text(json.dumps(sidecar))
    state = verify_asset(str(copy_of_asset), return_state=True)
    assert state.is_failed()
    with pytest.raises(IntegrityError, match="does not match its sidecar"):
        state.result()


def test_an_asset_without_sidecar_fails_the_run(copy_of_asset: Path) -> None:
    Path(str(copy_of_asset) + ".manifest.json").unlink()
    state = verify_asset(str(copy_of_asset), return_state=True)
    assert state.is_failed()
    with pytest.raises(FileNotFoundError, match="no sidecar"):
        state.result()


@pytest.mark.parametrize("fraction", [0.0, 1.5])
def test_sample_fraction_is_checked_before_the_run(prefect_harness: str, fraction: float) -> None:
    with pytest.raises(Exception, match="sample_fraction"):
        verify_asset("/nowhere.h5", sample_fraction=fraction)


def _flow_run_text(flow_run_id: Any) -> str:
    """Everything the server recorded about a flow run: parameters, logs, artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter

    async def read() -> str:
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id={"any_": [run.id]}))
            artifacts = await client.read_artifacts(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
            )
            return "\n".join(
                [
                    json.dumps(run.parameters, default=str),
                    *(log.message for log in logs),
                    *(str(a.data) for a in artifacts),
                ]
            )

    return asyncio.run(read())


def _server_text() -> str:
    """Everything the test server holds about every run: each flow run and task run whole
    (parameters, task inputs, cache keys, states and their result records), every log line
    and every artifact; and every persisted result in local storage."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    async def every(read: Any) -> list[Any]:
        found: list[Any] = []
        while page := await read(offset=len(found), limit=200):
            found.extend(page)
        return found

    async def read() -> list[str]:
        async with get_client() as client:
            runs = await every(client.read_flow_runs)
            tasks = await every(client.read_task_runs)
            logs = await every(client.read_logs)
            artifacts = await every(client.read_artifacts)
        return [
            *(r.model_dump_json() for r in runs),
            *(t.model_dump_json() for t in tasks),
            *(log.message for log in logs),
            *(a.model_dump_json() for a in artifacts),
        ]

    texts = asyncio.run(read())
    storage = Path(get_current_settings().results.local_storage_path)
    if storage.is_dir():
        texts += [
            f.read_bytes().decode("utf-8", "replace") for f in storage.rglob("*") if f.is_file()
        ]
    return "\n".join(texts)


def test_build_and_verify_over_s3_with_credentials_from_a_secret_block(
    built: Any, s3_bucket: str, s3_storage_options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    from prefect.blocks.system import Secret

    # Everything h5forge and Prefect log in this process (botocore's own DEBUG lines, which
    # quote the signed request, are not ours to police).
    caplog.set_level(logging.DEBUG, logger="h5forge")
    caplog.set_level(logging.DEBUG, logger="prefect")
    # Moto accepts any key pair; distinctive values let the test look for leaks.
    options = {**s3_storage_options, "key": "AKIAH5FORGETEST", "secret": "s3cr3t-h5forge-test"}
    Secret(value=options).save("h5forge-test-s3", overwrite=True)
    url = f"s3://{s3_bucket}/assets/demo.h5"
    config = BuildConfig(
        source=built.config.source,
        sha256=built.config.sha256,
        destination=url,
        credentials_block="h5forge-test-s3",
        smoke_workers=0,
    )
    state = build_dataset(config, cache_dir=str(built.cache_dir), return_state=True)
    assert state.is_completed(), state.message
    assert state.result().destination == url

    checked = verify_asset(url, credentials_block="h5forge-test-s3", return_state=True)
    assert checked.is_completed(), checked.message
    assert checked.result()["sha256"] == state.result().sha256

    for run in (state, checked):
        recorded = _flow_run_text(run.state_details.flow_run_id)
        assert "s3cr3t-h5forge-test" not in recorded
        assert "AKIAH5FORGETEST" not in recorded
    # The storage options travel as a Location inside the library: none of it may reach a
    # flow or task run's parameters, inputs, cache key, result, artifact or log, here or in
    # what this process logged.
    everything = _server_text() + caplog.text
    assert url in everything  # the search reaches what the runs recorded
    assert "s3cr3t-h5forge-test" not in everything
    assert "AKIAH5FORGETEST" not in everything


def test_a_sharded_version_verifies_its_manifest_and_every_shard(
    prefect_harness: str, tmp_path: Path
) -> None:
    """The latest version of an asset published sharded: no sidecar, its manifest and shards;
    a missing shard fails the run, naming it."""
    from h5forge.demo import write_image_folder
    from h5forge.discover.catalog import discover
    from h5forge.publish.manifest import shard_key
    from tests.fixtures.sharded import make_sharded_version

    write_image_folder(tmp_path / "photos", classes=("ant", "bee"), per_class=4, seed=2)
    catalog = discover(tmp_path / "photos")
    base = tmp_path / "store" / "photos"
    sha = make_sharded_version(base, catalog, [(0, 4), (4, 8)], work=tmp_path / "work")
    state = verify_asset(str(base) + ".h5", sample_fraction=1.0, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result["sha256"] == sha
    assert result["num_samples"] == 8
    assert result["checked_samples"] == 8
    assert len(result["shards"]) == 2
    second = result["shards"][1]["sha256"]
    (base / shard_key(second)).unlink()
    state = verify_asset(str(base), return_state=True)
    assert state.is_failed()
    with pytest.raises(IntegrityError, match=rf"shard 1 \({second[:16]}\): missing"):
        state.result()

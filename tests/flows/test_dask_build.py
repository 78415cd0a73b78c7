"""``build-h5-dataset`` with ``executor="dask"`` on a real two-process ``LocalCluster``.

The part tasks run on the cluster's worker processes through prefect-dask's
``DaskTaskRunner`` and report to the session's Prefect test server. Checked here: the Dask
build publishes the same samples (digests, labels, pixels) as the local build, also when a
worker process is killed mid-build; a build killed after k of n parts is resumed by a re-run
that packs only the n - k missing ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import h5py
import numpy as np
import pytest
from pydantic import ValidationError

from h5forge.flows.build import BuildConfig, BuildSummary, build_dataset
from tests.fixtures.prefect import flow_run_artifacts, flow_run_task_runs

REPO_ROOT = Path(__file__).resolve().parents[2]
INPUTS = 302  # the demo: 300 images and 2 broken files


@dataclass(frozen=True)
class Cluster:
    address: str
    client: Any  # distributed.Client, for looking at the workers


@pytest.fixture(scope="module")
def cluster(prefect_harness: str) -> Iterator[Cluster]:
    """A real Dask cluster: 2 worker processes x 1 thread, started after the Prefect server
    so the workers inherit ``PREFECT_API_URL``."""
    from distributed import Client, LocalCluster

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # for client.run(...) below
    with (
        # ":0": a free port (None means distributed's default 8787, which another cluster
        # on the machine may hold: a warning, an error under -W error).
        LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
        ) as local,
        Client(local, set_as_default=False) as client,
    ):  # the flow connects by address
        yield Cluster(address=local.scheduler_address, client=client)
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _config(demo_archive: Any, dest: Path, **changes: Any) -> BuildConfig:
    return BuildConfig(
        source=str(demo_archive.path),
        sha256=demo_archive.sha256,
        destination=str(dest),
        smoke_workers=0,
        smoke_batches=1,
        **changes,
    )


def _build(config: BuildConfig, cache: Path) -> tuple[BuildSummary, Any]:
    state = build_dataset(config, cache_dir=str(cache), return_state=True)
    assert state.is_completed(), state.message
    return state.result(), state.state_details.flow_run_id


def _part_runs(flow_run_id: Any) -> list[str]:
    """Names of the flow run's pack-part task runs, e.g. ``pack-part[demo.h5 part-00003.h5]``."""
    return sorted(
        t.name for t in flow_run_task_runs(flow_run_id) if t.name.startswith("pack-part[")
    )


def _assert_same_samples(got: Path, ref: Path) -> None:
    """Same samples as ``ref``, the demo built by the local executor (the ``built`` fixture)."""
    with h5py.File(got) as a, h5py.File(ref) as b:
        assert a.attrs["num_samples"] == b.attrs["num_samples"] == 300
        for name in (
            "digests",
            "labels",
            "splits",
            "paths",
            "classes",
            "split_names",
            "quarantine/paths",
        ):
            assert np.array_equal(a[name][()], b[name][()]), name
        assert np.array_equal(a["images"][()], b["images"][()])


def _pid() -> int:
    return os.getpid()


def _kill_when(staging: Path, parts: int, pid: int) -> threading.Thread:
    """SIGKILL ``pid`` (a Dask worker) once ``parts`` parts are done in ``staging``."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if staging.exists() and len(_sidecars(staging)) >= parts:
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_dask_build_equals_the_local_build_even_when_a_worker_dies(
    cluster: Cluster, built: Any, demo_archive: Any, fetch_cache: Path, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    config = _config(
        demo_archive,
        tmp_path / "out" / "demo.h5",
        executor="dask",
        dask_address=cluster.address,
        part_size=20,
        staging=str(staging),
    )
    victim = next(iter(cluster.client.run(_pid).values()))
    killer = _kill_when(staging, 2, victim)  # mid-build: the nanny restarts it, Dask reruns
    summary, run_id = _build(config, fetch_cache)
    killer.join()

    assert victim not in cluster.client.run(_pid).values()
    _assert_same_samples(tmp_path / "out" / "demo.h5", built.dest)
    assert (built.summary.executor, built.summary.parts) == ("local", None)
    assert summary.executor == "dask"
    assert summary.parts is not None
    assert (summary.parts.total, summary.parts.skipped) == (16, ())
    assert summary.parts.packed == tuple(range(16))
    assert list(summary.seconds)[:5] == ["fetch", "discover", "pack", "merge", "verify"]
    assert _part_runs(run_id) == [f"pack-part[demo.h5 part-{i:05d}.h5]" for i in range(16)]
    report = next(a for a in flow_run_artifacts(run_id) if a.key == "build-report-demo-h5")
    assert f"dask: `{cluster.address}`" in report.data
    assert "**packed by this run**: 16; **skipped**" in report.data
    assert not list(staging.iterdir())  # published: the parts are gone


def _sidecars(staging: Path) -> set[str]:
    return {p.name.removesuffix(".manifest.json") for p in staging.glob("*.manifest.json")}


def _busy(dask_worker: Any) -> int:
    return len(dask_worker.state.executing) + len(dask_worker.state.long_running)


def _wait_until_idle(cluster: Cluster, timeout: float = 60.0) -> None:
    """Parts still running when their flow died finish (or are dropped) on the workers."""
    deadline, quiet_since = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        busy = sum(cluster.client.run(_busy).values()) + cluster.client.run_on_scheduler(
            lambda dask_scheduler: len(dask_scheduler.tasks)
        )
        quiet_since = (quiet_since or time.monotonic()) if busy == 0 else None
        if quiet_since and time.monotonic() - quiet_since > 1.0:
            return
        time.sleep(0.1)
    raise TimeoutError(f"the Dask cluster is still busy after {timeout} s")


_RUN_FLOW = """
import sys
from h5forge.flows.build import BuildConfig, build_dataset
build_dataset(BuildConfig.model_validate_json(sys.argv[1]), cache_dir=sys.argv[2])
"""


@pytest.mark.slow
def test_a_killed_build_resumes_and_packs_only_the_missing_parts(
    cluster: Cluster, built: Any, demo_archive: Any, fetch_cache: Path, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    config = _config(
        demo_archive,
        tmp_path / "out" / "demo.h5",
        executor="dask",
        dask_address=cluster.address,
        part_size=20,
        staging=str(staging),
    )
    n = -(-INPUTS // 20)
    log = (tmp_path / "killed.log").open("w")
    run = subprocess.Popen(
        [sys.executable, "-c", _RUN_FLOW, config.model_dump_json(), str(fetch_cache)],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=log,
        env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
    )
    try:
        deadline = time.monotonic() + 120
        while not staging.exists() or len(_sidecars(staging)) < 3:
            assert run.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no part finished in 120 s"
            time.sleep(0.02)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
        log.close()
    _wait_until_idle(cluster)
    done = _sidecars(staging)
    k = len(done)
    assert 3 <= k < n, f"{k} of {n} parts finished before the kill landed"
    done_index = {int(name[len("part-") : -len(".h5")]) for name in done}

    summary, run_id = _build(config, fetch_cache)

    assert summary.parts is not None
    assert set(summary.parts.skipped) == done_index
    assert set(summary.parts.packed) == set(range(n)) - done_index  # only the n - k
    assert len(_part_runs(run_id)) == n - k
    assert all(f"part-{i:05d}.h5" not in name for name in _part_runs(run_id) for i in done_index)
    _assert_same_samples(tmp_path / "out" / "demo.h5", built.dest)
    sidecar = json.loads(Path(str(tmp_path / "out" / "demo.h5") + ".manifest.json").read_text())
    assert sidecar["num_samples"] == 300


def test_the_workers_get_the_staging_options_only_when_it_is_remote(tmp_path: Path) -> None:
    from h5forge.flows.dask_stage import _for_workers
    from h5forge.location import Location

    secret = {"key": "AKIA-staging", "secret": "s3cr3t"}
    for local in (str(tmp_path), f"file://{tmp_path}"):
        assert _for_workers(Location(local, secret)) == Location(local)
    remote = Location("memory://h5forge-test-dask-staging", secret)
    assert _for_workers(remote) == remote
    assert _for_workers(Location(str(tmp_path))) == Location(str(tmp_path))


# --------------------------------------------------------------------------- BuildConfig

GOOD = {"source": "/data/flowers.tar.gz", "destination": "/assets/flowers.h5"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"executor": "dask"}, "executor='dask' needs dask_address"),
        ({"executor": "dask", "dask_address": ""}, "executor='dask' needs dask_address"),
        ({"executor": "dask", "dask_address": "scheduler:8786"}, "not a Dask scheduler address"),
        (
            {"executor": "dask", "dask_address": "http://scheduler:8786"},
            "not a Dask scheduler address",
        ),
        ({"executor": "dask", "dask_address": "tcp://scheduler:70000"}, "port 1..65535"),
        ({"executor": "dask", "dask_address": "tcp://scheduler"}, "tcp://HOST:PORT"),
        ({"dask_address": "tcp://scheduler:8786"}, "apply to executor='dask' only"),
        ({"staging": "/mnt/shared/staging"}, "staging apply to executor='dask' only"),
        (
            {"executor": "dask", "dask_address": "tcp://s:8786", "staging": "https://x/y/"},
            "read-only",
        ),
        (
            {"executor": "dask", "dask_address": "tcp://s:8786", "staging": "s3://k:secret@b/s"},
            "embeds credentials",
        ),
        (
            {"executor": "dask", "dask_address": "tcp://s:8786", "part_size": 0},
            "greater than or equal to 1",
        ),
        ({"executor": "ray"}, "'local' or 'dask'"),
    ],
)
def test_build_config_rejects_bad_executor_settings(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BuildConfig(**{**GOOD, **changes})


@pytest.mark.parametrize(
    "address",
    [
        "tcp://scheduler:8786",
        "tls://10.0.0.5:8786",
        "tcp://[::1]:8786",
        " tcp://dask.example.org:1 ",
    ],
)
def test_build_config_accepts_dask_addresses(address: str) -> None:
    config = BuildConfig(
        **GOOD, executor="dask", dask_address=address, staging="s3://bucket/staging/flowers/"
    )
    assert config.dask_address == address.strip()
    assert (config.part_size, config.part_bytes) == (2000, None)


def test_cli_build_takes_the_executor_options(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from h5forge.deployments.cli import app

    args = ["build", str(tmp_path), str(tmp_path / "out.h5"), "--executor", "dask"]
    missing = CliRunner().invoke(app, args)
    assert missing.exit_code == 2
    assert "needs dask_address" in missing.output
    bad = CliRunner().invoke(
        app, [*args, "--dask-address", "tcp://scheduler:8786", "--part-size", "0"]
    )
    assert bad.exit_code == 2
    assert "part_size" in bad.output

"""``deployments/prefect.yaml`` against the session's Prefect test server: ``prefect deploy --all``
registers the three deployments, a real ``prefect worker`` process on the process work pool runs
``run_deployment(...)`` calls to completion, and invalid parameters are rejected clearly.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.deployments import run_deployment
from prefect.exceptions import PrefectHTTPStatusError

from h5forge.flows.build import BuildConfig
from tests.deployments._processes import (
    BUILD_FLOW,
    PREFECT,
    REPO_ROOT,
    VERIFY_FLOW,
    WORK_POOL,
    api_get,
    child_process,
    log_tail,
    prefect_env,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NAMES = {
    "on-demand": BUILD_FLOW,
    "nightly": BUILD_FLOW,
    "nightly-verify": VERIFY_FLOW,
}


def _cli(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [PREFECT, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def deployed(prefect_harness: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Create the process work pool and run ``prefect deploy --all`` from the repo root, as the
    README says; returns each deployment as the API reports it, by deployment name."""
    env = prefect_env(prefect_harness, tmp_path_factory.mktemp("deploy-home"))
    _cli(["work-pool", "create", WORK_POOL, "--type", "process", "--overwrite"], env)
    _cli(["--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"], env)
    found = {}
    for name, flow_name in NAMES.items():
        response = api_get(prefect_harness, f"/deployments/name/{flow_name}/{name}")
        assert response.status_code == 200, f"{flow_name}/{name} not registered: {response.text}"
        found[name] = response.json()
    return found


@pytest.fixture(scope="module")
def worker(
    deployed: dict[str, Any], prefect_harness: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """``prefect worker start --pool h5forge-process`` as a subprocess, started in a directory
    that is not the repo: the deployments' pull step must take the flow runs there. Yields the
    worker's log."""
    workdir = tmp_path_factory.mktemp("worker")
    env = prefect_env(prefect_harness, workdir / "home", PREFECT_WORKER_QUERY_SECONDS="1")
    log = workdir / "worker.log"
    args = [PREFECT, "worker", "start", "--pool", WORK_POOL, "--type", "process"]
    with child_process(args, env=env, log=log, cwd=workdir):
        yield log


def _schema_property(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    """Follow ``properties`` (and ``$ref`` into ``definitions``/``$defs``) down ``path``."""
    node = schema
    for key in path:
        node = node["properties"][key]
        while "$ref" in node or "allOf" in node:
            ref = node["$ref"] if "$ref" in node else node["allOf"][0]["$ref"]
            section, name = ref.split("/")[-2:]
            node = schema[section][name]
    return node


def test_deploy_all_registers_the_three_deployments(deployed: dict[str, Any]) -> None:
    for name, deployment in deployed.items():
        assert deployment["work_pool_name"] == WORK_POOL, name
        assert deployment["enforce_parameter_schema"] is True, name
        # The pull step records the repo's absolute path at deploy time.
        assert deployment["pull_steps"] == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO_ROOT)}}
        ], name

    assert deployed["on-demand"]["schedules"] == []
    assert deployed["on-demand"]["parameters"] == {}
    crons = {
        name: [
            (s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in d["schedules"]
        ]
        for name, d in deployed.items()
    }
    assert crons["nightly"] == [("0 2 * * *", "UTC", True)]
    assert crons["nightly-verify"] == [("0 3 * * *", "UTC", True)]


def test_deployment_parameters_match_the_flows(deployed: dict[str, Any]) -> None:
    # The UI form comes from this schema: it must be the real BuildConfig (if importing the flow
    # fails, `prefect deploy` silently falls back to an empty schema and a bare JSON box).
    schema = deployed["on-demand"]["parameter_openapi_schema"]
    assert schema["required"] == ["config"]
    assert _schema_property(schema, "config", "size")["minimum"] == 8
    assert "description" in _schema_property(schema, "config", "source")
    # The nightly example parameters are a valid BuildConfig, and the re-verify checks the
    # asset the nightly build publishes.
    nightly = BuildConfig.model_validate(deployed["nightly"]["parameters"]["config"])
    assert nightly.overwrite
    assert deployed["nightly-verify"]["parameters"]["url"] == nightly.destination


def _run(name: str, parameters: dict[str, Any], timeout: float = 300) -> Any:
    return run_deployment(name, parameters=parameters, timeout=timeout, poll_interval=1)


def test_worker_runs_build_then_verify(worker: Path, demo_source: str, tmp_path: Path) -> None:
    destination = tmp_path / "published" / "demo.h5"
    # Small and in-process where the stages allow it: this is about the deployment machinery;
    # tests/flows covers the stages themselves.
    config = {
        "source": demo_source,
        "destination": str(destination),
        "size": 32,
        "workers": 1,
        "smoke_workers": 0,
    }

    built = _run(f"{BUILD_FLOW}/on-demand", {"config": config})
    assert built.state.is_completed(), f"build ended {built.state!r}\n{log_tail(worker, 150)}"
    assert destination.is_file()
    assert Path(f"{destination}.manifest.json").is_file()

    verified = _run(f"{VERIFY_FLOW}/nightly-verify", {"url": str(destination)})
    assert verified.state.is_completed(), f"verify ended {verified.state!r}\n{log_tail(worker)}"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param({"size": -1}, "Validation failed for field 'config.size'", id="negative-size"),
        pytest.param({"size": 0}, "0 is less than the minimum of 8", id="zero-size"),
        pytest.param({"layout": "jpeg"}, "Validation failed for field 'config.layout'", id="enum"),
    ],
)
def test_server_rejects_out_of_schema_parameters(
    deployed: dict[str, Any], tmp_path: Path, config: dict[str, Any], expected: str
) -> None:
    # Bounds and enums are in the JSON schema: the server refuses to create the run at all.
    params = {"source": str(tmp_path), "destination": str(tmp_path / "x.h5"), **config}
    with pytest.raises(PrefectHTTPStatusError, match="409 Conflict") as excinfo:
        _run(f"{BUILD_FLOW}/on-demand", {"config": params}, timeout=0)
    assert expected in str(excinfo.value)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {"source": "gopher9://host/images.tar"},
            "uses protocol 'gopher9', which fsspec does not know",
            id="unknown-scheme",
        ),
        pytest.param(
            {"destination": "https://example.org/out.h5"},
            "protocol 'https' is read-only",
            id="read-only-destination",
        ),
    ],
)
def test_flow_rejects_invalid_urls_before_any_work(
    worker: Path, tmp_path: Path, config: dict[str, Any], expected: str
) -> None:
    # URL checks are pydantic validators, not JSON schema: the run is created, and the flow's
    # parameter validation fails it before any task runs, naming the problem.
    params = {"source": str(tmp_path), "destination": str(tmp_path / "x.h5"), **config}
    flow_run = _run(f"{BUILD_FLOW}/on-demand", {"config": params}, timeout=180)
    assert flow_run.state.is_failed(), f"expected Failed, got {flow_run.state!r}"
    assert "Validation of flow parameters failed" in (flow_run.state.message or "")
    assert expected in flow_run.state.message
    assert not (tmp_path / "x.h5").exists()

"""``deployments/serve.py``: the environment it reads, the deployments it builds from
``prefect.yaml``, and a real ``python -m h5forge.deployments.serve`` process running the nightly
build and re-verify (their parameters overridden through the environment) to completion.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prefect.deployments import run_deployment

from h5forge.deployments.serve import (
    NIGHTLY,
    NIGHTLY_VERIFY,
    ON_DEMAND,
    ServeOptions,
    load_specs,
    options_from_env,
    runner_deployments,
)
from h5forge.location import Location
from h5forge.publish.versions import read_pointer
from tests.deployments._processes import (
    BUILD_FLOW,
    REPO_ROOT,
    VERIFY_FLOW,
    api_get,
    log_tail,
    prefect_env,
    served_deployments,
)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, ServeOptions(), id="defaults"),
        pytest.param({"H5FORGE_SCHEDULES": "off"}, ServeOptions(schedules=False), id="off"),
        pytest.param({"H5FORGE_SCHEDULES": " ON "}, ServeOptions(), id="on-padded"),
        pytest.param(
            {"H5FORGE_NIGHTLY_SOURCE": "s3://b/src/", "H5FORGE_NIGHTLY_DESTINATION": "/d/x.h5"},
            ServeOptions(nightly_source="s3://b/src/", nightly_destination="/d/x.h5"),
            id="overrides",
        ),
        pytest.param({"H5FORGE_NIGHTLY_SOURCE": ""}, ServeOptions(), id="empty-is-unset"),
        pytest.param(
            {"XDG_CACHE_HOME": "/c"}, ServeOptions(cache_dir="/c/h5forge"), id="cache-home"
        ),
        pytest.param({"XDG_CACHE_HOME": ""}, ServeOptions(), id="empty-cache-home-is-unset"),
    ],
)
def test_options_from_env(environ: dict[str, str], expected: ServeOptions) -> None:
    assert options_from_env(environ) == expected


def test_options_from_env_rejects_unknown_schedule_switch() -> None:
    with pytest.raises(ValueError, match=r"H5FORGE_SCHEDULES='sometimes' is not understood"):
        options_from_env({"H5FORGE_SCHEDULES": "sometimes"})


def test_runner_deployments_follow_prefect_yaml() -> None:
    specs = {spec["name"]: spec for spec in load_specs()}
    served = {d.name: d for d in runner_deployments()}

    assert set(served) == set(specs) == {ON_DEMAND, NIGHTLY, NIGHTLY_VERIFY}
    assert served[ON_DEMAND].entrypoint == "h5forge.flows.build.build_dataset"
    assert served[NIGHTLY_VERIFY].entrypoint == "h5forge.flows.verify.verify_asset"
    for name, deployment in served.items():
        assert deployment.parameters == specs[name].get("parameters", {}), name
        assert deployment.work_pool_name is None, name  # served, not pooled
        crons = [(s.schedule.cron, s.active) for s in deployment.schedules or []]
        assert crons == [(s["cron"], True) for s in specs[name].get("schedules", [])], name


@pytest.mark.parametrize(
    "entrypoint", ["flows/build.py:build_dataset", "flows.build:build_dataset", "h5forge.flows"]
)
def test_a_pre_0_2_entrypoint_is_refused_naming_the_module_path(entrypoint: str) -> None:
    spec = {**load_specs()[0], "entrypoint": entrypoint}
    with pytest.raises(ValueError, match=r"'h5forge\.flows\.build:build_dataset'") as caught:
        runner_deployments(specs=[spec])
    assert repr(entrypoint) in str(caught.value)


def test_runner_deployments_apply_options() -> None:
    options = ServeOptions(schedules=False, nightly_source="/src", nightly_destination="/out.h5")
    served = {d.name: d for d in runner_deployments(options)}

    assert served[NIGHTLY].parameters["config"]["source"] == "/src"
    assert served[NIGHTLY].parameters["config"]["destination"] == "/out.h5"
    assert served[NIGHTLY].parameters["config"]["size"] == 64  # the rest stays as in the YAML
    assert served[NIGHTLY_VERIFY].parameters["url"] == "/out.h5"
    schedules = [s for d in served.values() for s in d.schedules or []]
    assert len(schedules) == 2
    assert not any(s.active for s in schedules)


def test_runner_deployments_give_the_builds_the_cache_dir() -> None:
    served = {d.name: d for d in runner_deployments(ServeOptions(cache_dir="/c/h5forge"))}

    assert served[ON_DEMAND].parameters["cache_dir"] == "/c/h5forge"
    assert served[NIGHTLY].parameters["cache_dir"] == "/c/h5forge"
    assert "cache_dir" not in served[NIGHTLY_VERIFY].parameters  # the re-verify fetches nothing


def test_load_specs_rejects_a_file_without_deployments(tmp_path: Path) -> None:
    path = tmp_path / "prefect.yaml"
    path.write_text("name: empty\ndeployments: []\n")
    with pytest.raises(ValueError, match="declares no deployments"):
        load_specs(path)


def test_serve_refuses_to_start_without_an_api_url(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "h5forge.deployments.serve"],
        cwd=REPO_ROOT, env=prefect_env(None, tmp_path), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "PREFECT_API_URL is not set" in done.stderr


def _run(name: str, parameters: dict[str, Any] | None = None) -> Any:
    return run_deployment(name, parameters=parameters or {}, timeout=300, poll_interval=1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_served_nightly_build_and_verify_complete(
    prefect_harness: str, tmp_path: Path, demo_source: str
) -> None:
    destination = tmp_path / "nightly" / "demo.h5"
    env = {"H5FORGE_NIGHTLY_SOURCE": demo_source, "H5FORGE_NIGHTLY_DESTINATION": str(destination)}
    with served_deployments(prefect_harness, tmp_path, **env) as log:
        nightly = api_get(prefect_harness, f"/deployments/name/{BUILD_FLOW}/{NIGHTLY}").json()
        assert [s["active"] for s in nightly["schedules"]] == [False]  # H5FORGE_SCHEDULES=off

        built = _run(f"{BUILD_FLOW}/{NIGHTLY}")
        assert built.state.is_completed(), f"build ended {built.state!r}\n{log_tail(log, 150)}"
        verified = _run(f"{VERIFY_FLOW}/{NIGHTLY_VERIFY}")
        assert verified.state.is_completed(), f"verify ended {verified.state!r}\n{log_tail(log)}"
    # The nightly builds versions (issue 13): the pointer beside the destination names one.
    pointer = read_pointer(Location(str(destination)))
    assert pointer is not None
    assert Path(pointer.url).is_file()
    assert not destination.exists()

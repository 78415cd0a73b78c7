"""Scheduled operation of the nightly deployment against the Prefect test server: one run at a
time (the second waits for a slot), an ``h5forge.source.changed`` trigger on its source, and the
automation that pauses it when its asset fails verification (created once, however often)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import ConcurrencyLimitStrategy
from prefect.events.actions import PauseDeployment, RunDeployment
from prefect.states import Completed, Pending

from h5forge.deployments.automations import (
    SOURCE_CHANGED,
    ensure_automation,
    pause_automation_name,
    pause_on_verify_failure,
)
from h5forge.deployments.serve import NIGHTLY, ServeOptions, ensure_automations, load_specs
from h5forge.deployments.serve import runner_deployments as served
from h5forge.tasks.publish import asset_key
from h5forge.tasks.verify import VERIFY_FAILED

pytestmark = pytest.mark.timeout(300)


def _nightly(options: ServeOptions) -> Any:
    return {d.name: d for d in served(options)}[NIGHTLY]


def test_the_yaml_trigger_names_the_yaml_source() -> None:
    spec = {s["name"]: s for s in load_specs()}[NIGHTLY]
    (trigger,) = spec["triggers"]
    assert trigger["expect"] == [SOURCE_CHANGED]
    assert trigger["match"]["prefect.resource.id"] == spec["parameters"]["config"]["source"]


def test_the_nightly_runs_one_at_a_time_and_on_source_changes() -> None:
    nightly = _nightly(ServeOptions(nightly_source="s3://key:secret@bucket/incoming/"))
    assert nightly.concurrency_limit == 1
    assert nightly.concurrency_options.collision_strategy == ConcurrencyLimitStrategy.ENQUEUE
    (trigger,) = nightly.triggers
    assert trigger.expect == {SOURCE_CHANGED}
    assert trigger.match.root == {"prefect.resource.id": "s3://bucket/incoming/"}


def _read_deployment(deployment_id: UUID) -> Any:
    async def read() -> Any:
        async with get_client() as client:
            return await client.read_deployment(deployment_id)

    return asyncio.run(read())


def test_a_second_run_waits_while_the_first_runs(prefect_harness: str, tmp_path: Path) -> None:
    nightly = _nightly(ServeOptions(schedules=False, nightly_source=str(tmp_path)))
    deployment_id = nightly.apply()
    registered = _read_deployment(deployment_id)
    assert registered.global_concurrency_limit.limit == 1

    async def two_runs() -> tuple[Any, Any]:
        async with get_client() as client:
            first, second = [
                await client.create_flow_run_from_deployment(deployment_id) for _ in range(2)
            ]
            try:
                took = await client.set_flow_run_state(first.id, Pending())
                waited = await client.set_flow_run_state(second.id, Pending())
            finally:
                await client.set_flow_run_state(first.id, Completed(), force=True)
                await client.set_flow_run_state(second.id, Completed(), force=True)
            return took, waited

    took, waited = asyncio.run(two_runs())
    assert took.status.value == "ACCEPT"
    assert waited.status.value != "ACCEPT"
    assert waited.state.is_scheduled()
    assert waited.state.name == "AwaitingConcurrencySlot"


def test_the_source_trigger_is_registered(prefect_harness: str, tmp_path: Path) -> None:
    nightly = _nightly(ServeOptions(schedules=False, nightly_source=str(tmp_path)))
    deployment_id = nightly.apply()

    async def owned() -> list[Any]:
        async with get_client() as client:
            return list(await client.read_resource_related_automations(
                f"prefect.deployment.{deployment_id}"
            ))  # fmt: skip

    triggered = [a for a in asyncio.run(owned()) if SOURCE_CHANGED in a.trigger.expect]
    assert len(triggered) == 1
    (automation,) = triggered
    assert automation.trigger.match.root == {"prefect.resource.id": str(tmp_path)}
    assert [type(a) for a in automation.actions] == [RunDeployment]
    assert automation.actions[0].deployment_id == deployment_id


def test_the_pause_automation_is_made_once(prefect_harness: str, tmp_path: Path) -> None:
    destination = str(tmp_path / "out" / "nightly.h5")
    deployments = served(ServeOptions(schedules=False, nightly_destination=destination))
    ids = {d.name: d.apply() for d in deployments}

    ensure_automations(deployments, ids)
    ensure_automations(deployments, ids)  # a second start-up updates, never adds

    async def named() -> list[Any]:
        async with get_client() as client:
            return list(await client.read_automations_by_name(pause_automation_name(NIGHTLY)))

    (automation,) = asyncio.run(named())
    assert automation.enabled
    assert automation.trigger.expect == {VERIFY_FAILED}
    assert automation.trigger.match.root == {"prefect.resource.id": asset_key(destination)}
    assert automation.actions == [PauseDeployment(source="selected", deployment_id=ids[NIGHTLY])]


def test_ensure_automation_updates_a_changed_one(prefect_harness: str, tmp_path: Path) -> None:
    nightly = _nightly(ServeOptions(schedules=False))
    deployment_id = nightly.apply()
    name = "pause-test-deployment"
    first = ensure_automation(
        pause_on_verify_failure(deployment_id=deployment_id, deployment_name=name, asset="a.h5")
    )
    second = ensure_automation(
        pause_on_verify_failure(deployment_id=deployment_id, deployment_name=name, asset="b.h5")
    )
    assert second.id == first.id

    async def named() -> list[Any]:
        async with get_client() as client:
            return list(await client.read_automations_by_name(pause_automation_name(name)))

    (stored,) = asyncio.run(named())
    assert stored.trigger.match.root == {"prefect.resource.id": asset_key("b.h5")}

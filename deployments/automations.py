"""h5forge's Prefect events and automations, defined as code.

Two custom events:

``h5forge.verify.failed`` (:data:`h5forge.tasks.verify.VERIFY_FAILED`)
    Emitted by the verify tasks when a check fails. Its resource id is the asset's key
    (:func:`h5forge.tasks.publish.asset_key`: credential-free; a local path becomes the
    ``file://`` URI of its absolute path). :func:`pause_on_verify_failure` is the automation
    that answers it: it pauses the deployment that publishes that asset (the nightly build), so
    a broken asset is not rebuilt over and over until someone has looked. Resume the deployment
    in the UI (or ``prefect deployment resume``) once it is fixed.

``h5forge.source.changed`` (:data:`SOURCE_CHANGED`)
    Emitted by whatever notices new data in a source (a bucket notification through a
    webhook, a cron job, :func:`emit_source_changed`). Its resource id is the source URL as the
    deployment's ``config.source`` spells it, credentials removed (:func:`source_resource_id`).
    The nightly deployment has a deployment trigger on it (``triggers:`` in ``prefect.yaml``,
    :func:`source_changed_trigger` in :mod:`h5forge.deployments.serve`): new data is built without
    waiting for the night.

The pause automation is not owned by the deployment: ``prefect deploy`` and ``serve`` delete
and recreate a deployment's own automations (its triggers) on every registration, and would
drop it. :func:`ensure_automation` creates or updates it by name instead, so calling it at each
start-up (:func:`h5forge.deployments.serve.main` does) leaves exactly one.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect.automations import Automation
from prefect.events import DeploymentEventTrigger, EventTrigger, emit_event
from prefect.events.actions import PauseDeployment
from prefect.events.schemas.automations import Posture

from h5forge.redact import redact_url
from h5forge.tasks.publish import asset_key
from h5forge.tasks.verify import VERIFY_FAILED

__all__ = [
    "SOURCE_CHANGED",
    "emit_source_changed",
    "ensure_automation",
    "pause_automation_name",
    "pause_on_verify_failure",
    "source_changed_trigger",
    "source_resource_id",
]

SOURCE_CHANGED = "h5forge.source.changed"


def source_resource_id(source: str) -> str:
    """The resource id of :data:`SOURCE_CHANGED` for ``source``: the URL, credentials removed."""
    return redact_url(source)


def source_changed_trigger(source: str, *, name: str) -> DeploymentEventTrigger:
    """A deployment trigger: run the deployment when :data:`SOURCE_CHANGED` names ``source``."""
    return DeploymentEventTrigger(
        name=name,
        description=f"Run when {SOURCE_CHANGED} is emitted for the deployment's source",
        expect={SOURCE_CHANGED},
        match={"prefect.resource.id": source_resource_id(source)},
    )


def emit_source_changed(source: str, payload: dict[str, Any] | None = None) -> None:
    """Emit :data:`SOURCE_CHANGED` for ``source`` (e.g. from a job that watches a bucket)."""
    emit_event(
        event=SOURCE_CHANGED,
        resource={"prefect.resource.id": source_resource_id(source)},
        payload=payload or {},
    )


def pause_automation_name(deployment_name: str) -> str:
    """The name :func:`pause_on_verify_failure` gives its automation (unique per deployment)."""
    return f"h5forge: pause {deployment_name} when its asset fails verification"


def pause_on_verify_failure(*, deployment_id: UUID, deployment_name: str, asset: str) -> Automation:
    """The automation: on :data:`~h5forge.tasks.verify.VERIFY_FAILED` for ``asset``, pause.

    Args:
        deployment_id: the deployment to pause (the one that publishes ``asset``).
        deployment_name: its name, for the automation's name.
        asset: the asset's destination, as the deployment's ``config.destination`` spells it
            (relative paths resolve against the working directory, as the flow's do).
    """
    return Automation(
        name=pause_automation_name(deployment_name),
        description=f"Pause deployment {deployment_name} when {VERIFY_FAILED} names its asset",
        enabled=True,
        trigger=EventTrigger(
            expect={VERIFY_FAILED},
            match={"prefect.resource.id": asset_key(asset)},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[PauseDeployment(source="selected", deployment_id=deployment_id)],
    )


def ensure_automation(automation: Automation) -> Automation:
    """Create ``automation``, or update the one of the same name; returns it with its id.

    Idempotent: run at every start-up, it leaves one automation of that name, as given.
    """
    # Called from sync code, Prefect's async-dispatched methods return their results.
    try:
        existing = Automation.read(name=automation.name)
    except ValueError:  # Prefect's "not found"
        created = automation.create()
        assert isinstance(created, Automation)
        return created
    assert isinstance(existing, Automation)
    automation.id = existing.id
    automation.update()
    return automation

"""Serve h5forge's deployments from one process: ``python -m h5forge.deployments.serve``.

Serves the three deployments declared in ``deployments/prefect.yaml`` -- the on-demand build
(the UI's run form), the nightly build and the nightly re-verify -- with one Prefect runner: no
work pool and no worker needed. The YAML file stays the single description of the deployments;
this module only adapts it to ``prefect.serve`` and applies the overrides below.

Scheduling, as declared in ``prefect.yaml`` and kept here:

- ``concurrency_limit`` (``limit``, ``collision_strategy``) becomes the deployment's own
  concurrency limit. The nightly has ``limit: 1, ENQUEUE``: it always writes one destination,
  so a second run (the schedule, a trigger and a person at once) waits for the first instead of
  writing the same asset. Prefect 3.9 offers this per deployment, enforced by the server when a
  run goes to Pending; a global limit keyed by destination would have to be taken inside the
  flow, for every destination the on-demand form may be given. There, a versioned publish
  refuses when another build moved ``latest`` while it ran (one step under the asset's lock on
  a local store; :func:`h5forge.publish.release.publish_version`'s ``based_on``).
- ``triggers`` become deployment triggers. The nightly's ``h5forge.source.changed`` trigger is
  re-pointed at the effective source (``H5FORGE_NIGHTLY_SOURCE`` below), so an override never
  leaves it waiting for events of another source.
- At start-up, after registering the deployments, :func:`main` creates or updates the
  automation that pauses the nightly when its asset fails verification
  (:func:`h5forge.deployments.automations.pause_on_verify_failure`, via :func:`ensure_automations`).

Relative paths in the parameters resolve against the directory the command runs in (run it
from the repository root). Environment, read when :func:`main` runs, never at import:

``PREFECT_API_URL``
    The server to register with and poll (Prefect's own setting).
``H5FORGE_SCHEDULES``
    ``on`` (default) or ``off``. ``off`` registers the cron schedules inactive, so nothing runs
    unless someone triggers it -- what tests and a laptop want.
``H5FORGE_NIGHTLY_SOURCE``
    Source of the nightly build (path or fsspec URL); default from ``prefect.yaml``.
``H5FORGE_NIGHTLY_DESTINATION``
    Destination ``.h5`` of the nightly build, which is also the asset the nightly re-verify
    checks; default from ``prefect.yaml``.
``XDG_CACHE_HOME``
    The build deployments keep fetched sources in ``$XDG_CACHE_HOME/h5forge`` (their
    ``cache_dir`` parameter); unset, the flow's default ``~/.cache/h5forge``.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import yaml
from prefect import Flow, get_client, serve
from prefect.automations import Automation
from prefect.client.schemas.objects import ConcurrencyLimitConfig
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.events import DeploymentTriggerTypes
from prefect.schedules import Cron
from prefect.settings import get_current_settings
from pydantic import TypeAdapter

from h5forge.cli.exits import EXIT_INTERRUPTED
from h5forge.deployments.automations import (
    SOURCE_CHANGED,
    ensure_automation,
    pause_on_verify_failure,
    source_resource_id,
)
from h5forge.deployments.settings import cache_dir_from_env
from h5forge.deployments.stopping import stop_within

__all__ = [
    "NIGHTLY",
    "NIGHTLY_VERIFY",
    "ON_DEMAND",
    "PREFECT_YAML",
    "ServeOptions",
    "ensure_automations",
    "load_specs",
    "main",
    "options_from_env",
    "runner_deployments",
]

PREFECT_YAML = Path(__file__).with_name("prefect.yaml")
ON_DEMAND = "on-demand"
NIGHTLY = "nightly"
NIGHTLY_VERIFY = "nightly-verify"

_TRIGGERS: TypeAdapter[DeploymentTriggerTypes] = TypeAdapter(DeploymentTriggerTypes)
_TRUE = frozenset({"1", "on", "true", "yes"})
_FALSE = frozenset({"0", "off", "false", "no"})


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """What the environment may change about the served deployments.

    Attributes:
        schedules: Whether the cron schedules are active.
        nightly_source: Overrides the nightly build's ``config.source``.
        nightly_destination: Overrides the nightly build's ``config.destination`` and the
            nightly re-verify's ``url`` (they name the same asset).
        cache_dir: The build deployments' ``cache_dir`` parameter (their fetch cache); None
            leaves the flow's default.
    """

    schedules: bool = True
    nightly_source: str | None = None
    nightly_destination: str | None = None
    cache_dir: str | None = None


def options_from_env(environ: Mapping[str, str]) -> ServeOptions:
    """Read :class:`ServeOptions` from an environment mapping (``os.environ`` in :func:`main`).

    Raises:
        ValueError: ``H5FORGE_SCHEDULES`` is neither on/true/1/yes nor off/false/0/no.
    """
    raw = environ.get("H5FORGE_SCHEDULES", "on").strip().lower()
    cache = cache_dir_from_env(environ)
    if raw not in _TRUE | _FALSE:
        raise ValueError(
            f"H5FORGE_SCHEDULES={raw!r} is not understood: use 'on' or 'off' "
            f"(also accepted: {', '.join(sorted(_TRUE | _FALSE))})"
        )
    return ServeOptions(
        schedules=raw in _TRUE,
        nightly_source=environ.get("H5FORGE_NIGHTLY_SOURCE") or None,
        nightly_destination=environ.get("H5FORGE_NIGHTLY_DESTINATION") or None,
        cache_dir=None if cache is None else str(cache),
    )


def load_specs(path: str | os.PathLike[str] = PREFECT_YAML) -> list[dict[str, Any]]:
    """Return the ``deployments`` entries of a ``prefect.yaml`` file, as plain dicts."""
    with open(path, encoding="utf-8") as f:
        document = yaml.safe_load(f)
    specs = document.get("deployments") if isinstance(document, dict) else None
    if not isinstance(specs, list) or not specs:
        raise ValueError(
            f"{os.fspath(path)} declares no deployments: expected a 'deployments' list"
        )
    return specs


def runner_deployments(
    options: ServeOptions | None = None,
    *,
    specs: Sequence[Mapping[str, Any]] | None = None,
) -> list[RunnerDeployment]:
    """Turn the ``prefect.yaml`` deployment entries into deployments a runner can serve.

    Entrypoints are module paths (``h5forge.flows.build:build_dataset``), so the runner finds
    the flows from any working directory.
    Work pools are dropped: a served deployment runs in the serving process's runner.
    """
    options = ServeOptions() if options is None else options
    specs = load_specs() if specs is None else specs
    return [_to_runner_deployment(spec, options) for spec in specs]


def main() -> None:
    """Serve every deployment until interrupted.

    The first Ctrl-C pauses their schedules and stops, exit 130; when the server does not
    answer, within :data:`~h5forge.deployments.stopping.SHUTDOWN_GRACE_S` seconds, saying the
    schedules were not paused (:mod:`h5forge.deployments.stopping`).
    """
    url = get_current_settings().api.url
    if not url:
        # Without it Prefect would serve into a throwaway in-process server nobody can see.
        raise SystemExit(
            "PREFECT_API_URL is not set: start `prefect server start` and "
            "`export PREFECT_API_URL=http://127.0.0.1:4200/api` (or `prefect config set "
            "PREFECT_API_URL=...`), then run `python -m h5forge.deployments.serve` again"
        )
    options = options_from_env(os.environ)
    ids: dict[str, UUID] = {}
    with stop_within("h5forge serve") as interrupt:
        try:
            deployments = runner_deployments(options)
            ids = {d.name: _register(d) for d in deployments}  # serve() upserts them again
            ensure_automations(deployments, ids)
            serve(*deployments)
            # The runner pauses them on its way out only when the interrupt reached its
            # event loop's task; pause them here in any case (pausing twice is harmless).
            if interrupt.received.is_set():
                _pause(ids.values())
        except KeyboardInterrupt:  # before the runner took over, or while pausing
            pass
        except httpx.TransportError as e:
            if not interrupt.received.is_set():
                raise SystemExit(
                    f"h5forge serve: the Prefect server at {url} stopped answering ({e}); "
                    "start it again, then serve again"
                ) from None
            print(
                f"h5forge serve: stopped; the schedules were not paused: the Prefect server "
                f"at {url} does not answer ({e})",
                file=sys.stderr,
            )
    if interrupt.received.is_set():
        raise SystemExit(EXIT_INTERRUPTED)


def _pause(ids: Iterable[UUID]) -> None:
    with get_client(sync_client=True) as client:
        for deployment_id in ids:
            client.pause_deployment(deployment_id)


def _register(deployment: RunnerDeployment) -> UUID:
    deployment_id = deployment.apply()  # from sync code: the id itself, not a coroutine
    assert isinstance(deployment_id, UUID)
    return deployment_id


def ensure_automations(
    deployments: Sequence[RunnerDeployment], ids: Mapping[str, UUID]
) -> list[Automation]:
    """Create or update the automation pausing the nightly build when its asset fails verify.

    Args:
        deployments: the deployments of :func:`runner_deployments` (the nightly's destination
            is read from its parameters).
        ids: the id each was registered under, by deployment name.

    Returns:
        The automations, with their ids.
    """
    made = []
    for deployment in deployments:
        if deployment.name == NIGHTLY:
            automation = pause_on_verify_failure(
                deployment_id=ids[deployment.name],
                deployment_name=deployment.name,
                asset=deployment.parameters["config"]["destination"],
            )
            made.append(ensure_automation(automation))
    return made


def _to_runner_deployment(spec: Mapping[str, Any], options: ServeOptions) -> RunnerDeployment:
    name = spec["name"]
    parameters = _apply_overrides(name, copy.deepcopy(spec.get("parameters") or {}), options)
    flow = _load_flow(spec["entrypoint"])
    if options.cache_dir and "cache_dir" in flow.parameters.properties:
        parameters.setdefault("cache_dir", options.cache_dir)
    schedules = [
        Cron(
            item["cron"],
            timezone=item.get("timezone"),
            active=options.schedules and bool(item.get("active", True)),
        )
        for item in spec.get("schedules") or []
    ]
    limit = spec.get("concurrency_limit")
    deployment = flow.to_deployment(
        name=name,
        concurrency_limit=(
            ConcurrencyLimitConfig.model_validate(limit) if isinstance(limit, dict) else limit
        ),
        triggers=_triggers(spec, parameters),
        description=spec.get("description"),
        tags=list(spec.get("tags") or []),
        parameters=parameters,
        schedules=schedules,
        enforce_parameter_schema=bool(spec.get("enforce_parameter_schema", True)),
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    # `to_deployment` is async-dispatched: called from sync code it returns the object itself.
    assert isinstance(deployment, RunnerDeployment)
    return deployment


def _triggers(spec: Mapping[str, Any], parameters: Mapping[str, Any]) -> list[Any]:
    """The spec's ``triggers``, with each :data:`SOURCE_CHANGED` trigger pointed at the
    deployment's effective ``config.source``."""
    source = (parameters.get("config") or {}).get("source")
    triggers = []
    for i, item in enumerate(spec.get("triggers") or [], start=1):
        item = {"name": f"{spec['name']}__automation_{i}", **copy.deepcopy(item)}
        if source and SOURCE_CHANGED in (item.get("expect") or []):
            item["match"] = {
                **(item.get("match") or {}),
                "prefect.resource.id": source_resource_id(source),
            }
        triggers.append(_TRIGGERS.validate_python(item))
    return triggers


def _apply_overrides(
    name: str, parameters: dict[str, Any], options: ServeOptions
) -> dict[str, Any]:
    if name == NIGHTLY:
        config = parameters.setdefault("config", {})
        if options.nightly_source:
            config["source"] = options.nightly_source
        if options.nightly_destination:
            config["destination"] = options.nightly_destination
    elif name == NIGHTLY_VERIFY and options.nightly_destination:
        parameters["url"] = options.nightly_destination
    return parameters


def _load_flow(entrypoint: str) -> Flow[..., Any]:
    """Import the flow a ``prefect.yaml`` entrypoint (``package.module:function``) names."""
    module_name, sep, attribute = entrypoint.partition(":")
    if not sep or not module_name.startswith("h5forge.") or module_name.endswith(".py"):
        raise ValueError(
            f"entrypoint {entrypoint!r} is not of the form 'h5forge.flows.module:flow_function' "
            "(since h5forge 0.2.0 flows are named by module path, e.g. "
            "'h5forge.flows.build:build_dataset', not 'flows/build.py:build_dataset')"
        )
    module = importlib.import_module(module_name)
    flow = getattr(module, attribute)
    if not isinstance(flow, Flow):
        raise TypeError(
            f"entrypoint {entrypoint!r} names a {type(flow).__name__}, not a Prefect flow"
        )
    return flow


if __name__ == "__main__":
    main()

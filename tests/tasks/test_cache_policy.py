"""A task that takes a ``Location`` is never cached: its storage options may hold credentials,
and Prefect's default cache policy would hash every input (the options included) into the
task run's cache key. Every such task of the pipeline is held to ``NO_CACHE``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from typing import Any

from prefect import Task
from prefect.cache_policies import NO_CACHE

import h5forge.tasks
from h5forge.tasks.publish import publish_task, publish_version_task


def _takes_a_location(fn: Any) -> bool:
    """A parameter of ``fn`` is annotated with ``Location`` (the modules' annotations are
    strings: ``from __future__ import annotations``)."""
    annotations = [p.annotation for p in inspect.signature(fn).parameters.values()]
    return any(re.search(r"\bLocation\b", str(a)) for a in annotations)


def _located_tasks() -> dict[str, list[Task[Any, Any]]]:
    """Each task of the pipeline (publish's made per destination too) that takes a Location,
    by name."""
    tasks: list[Task[Any, Any]] = [publish_task("out.h5"), publish_version_task("out.h5")]
    for info in pkgutil.iter_modules(h5forge.tasks.__path__, "h5forge.tasks."):
        module = importlib.import_module(info.name)
        tasks += [v for v in vars(module).values() if isinstance(v, Task)]
    found: dict[str, list[Task[Any, Any]]] = {}
    for t in tasks:
        if _takes_a_location(t.fn):
            found.setdefault(t.name, []).append(t)
    return found


def test_no_task_that_takes_a_location_is_cached() -> None:
    found = _located_tasks()
    assert {
        "fingerprint",
        "find-reusable",
        "publish",
        "verify",
        "read-sidecar",
        "resolve-asset",
    } <= found.keys()
    for name, tasks in found.items():
        for t in tasks:
            assert t.cache_policy is NO_CACHE, (name, t.cache_policy)

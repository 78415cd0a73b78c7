"""No task hashes a Location's options into a cache key: they may hold credentials.

Prefect's default cache policy hashes every argument (``INPUTS``), and a ``Location`` pickles
as its URL and options, so a task that takes one must not cache on its inputs: it caches
nothing (``NO_CACHE``) or keys on what it chooses (a key function such as the fetch task's,
which keys on ``Location.key``, tested in ``test_fetch.py``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from prefect import Task
from prefect.cache_policies import CachePolicy, CompoundCachePolicy, Inputs

import h5forge.tasks
from h5forge.tasks.publish import publish_task, publish_version_task


def _tasks_taking_a_location() -> dict[str, tuple[Task[..., object], set[str]]]:
    """Every task of ``h5forge.tasks`` with a ``Location`` parameter (publish's, made per
    destination, too), and those parameters."""
    found: dict[str, tuple[Task[..., object], set[str]]] = {}
    made = {
        "publish_task": publish_task("out.h5"),
        "publish_version_task": publish_version_task("out.h5"),
    }
    candidates = [(f"h5forge.tasks.publish.{k}", t) for k, t in made.items()]
    for info in pkgutil.iter_modules(h5forge.tasks.__path__):
        module = importlib.import_module(f"h5forge.tasks.{info.name}")
        candidates += [
            (f"{module.__name__}.{obj.fn.__name__}", obj)
            for obj in vars(module).values()
            if isinstance(obj, Task) and obj.fn.__module__ == module.__name__
        ]
    for name, obj in candidates:
        params = inspect.signature(obj.fn).parameters.values()
        names = {p.name for p in params if "Location" in str(p.annotation)}
        if names:
            found[name] = (obj, names)
    return found


def _hashed_inputs(policy: CachePolicy | None, names: set[str]) -> set[str]:
    """Which of ``names`` the policy hashes into the cache key."""
    if isinstance(policy, Inputs):
        return names - set(policy.exclude)
    if isinstance(policy, CompoundCachePolicy):
        return set().union(*(_hashed_inputs(p, names) for p in policy.policies))
    return set()


TASKS = _tasks_taking_a_location()


def test_the_tasks_that_take_a_location_are_found() -> None:
    short = {name.rsplit(".", 1)[-1] for name in TASKS}
    assert {
        "fetch_source",
        "smoke_load_file",
        "pack_part_task",
        "merge_task",
        "check_source",
        "find_reusable",
        "verify_file",
        "load_sidecar",
        "resolve_asset",
        "publish_task",
        "publish_version_task",
    } <= short


@pytest.mark.parametrize("name", sorted(TASKS))
def test_no_task_hashes_a_location_into_its_cache_key(name: str) -> None:
    task, names = TASKS[name]
    hashed = _hashed_inputs(task.cache_policy, names)
    assert not hashed, (
        f"{name} caches on its inputs {sorted(hashed)}, Locations whose options may hold "
        "credentials; give it cache_policy=NO_CACHE or a key function on Location.key"
    )

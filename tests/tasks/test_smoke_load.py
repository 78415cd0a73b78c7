"""Fork hygiene for DataLoader workers inside Prefect tasks."""

from __future__ import annotations

import multiprocessing
import sys
import threading

import pytest
from prefect import flow, task

from h5forge.tasks.fork import forget_inherited_prefect_services


def _child() -> None:
    forget_inherited_prefect_services()


@task
def _fork_a_child() -> int | None:
    # Prefect's log and event services are running in this process (the task logs through
    # them), so the forked child inherits their at-exit hooks.
    process = multiprocessing.get_context("fork").Process(target=_child)
    process.start()
    process.join(timeout=60)
    return process.exitcode


@flow
def _flow() -> int | None:
    return _fork_a_child()


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_a_process_forked_inside_a_task_exits_cleanly_with_the_hook(prefect_harness: str) -> None:
    assert _flow() == 0


def _plain_hook() -> None:
    """An at-exit hook that belongs to no Prefect service."""


@pytest.mark.parametrize("prefect_loaded", [True, False])
def test_the_hook_is_a_no_op_without_prefect_services(
    monkeypatch: pytest.MonkeyPatch, prefect_loaded: bool
) -> None:
    # No-op: threading's at-exit hook list is the same list, holding the same hooks, whether
    # Prefect is loaded (with no service hook registered) or not loaded at all (under spawn).
    services = "prefect._internal.concurrency.services"
    if prefect_loaded:
        __import__(services)
    else:
        monkeypatch.delitem(sys.modules, services, raising=False)
    hooks = [_plain_hook]
    monkeypatch.setattr(threading, "_threading_atexits", hooks)
    forget_inherited_prefect_services(0)
    assert threading._threading_atexits is hooks  # type: ignore[attr-defined]
    assert hooks == [_plain_hook]

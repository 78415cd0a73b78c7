"""One retry policy: an error a retry cannot fix fails a task at its first attempt; a transient
one is retried. Counted on real flow runs (the session's Prefect test server records each
attempt), and every retrying task of the pipeline is held to the policy.
"""

from __future__ import annotations

import importlib
import pkgutil
import socket
from pathlib import Path
from typing import Any

import pytest
from prefect import Task, flow, task
from pydantic import BaseModel, ValidationError

import h5forge.tasks
from h5forge.errors import (
    ChecksumError,
    DestinationExistsError,
    DownloadRefusedError,
    IntegrityError,
    MissingExtraError,
    UnsafeArchiveError,
)
from h5forge.options import OptionError
from h5forge.tasks.common import is_transient, retry_if_transient, retry_upload, with_retries
from tests.fixtures.prefect import flow_run_task_runs

RETRIES = 2
ROOT = Path(__file__).resolve().parents[2]


class _Positive(BaseModel):
    n: int


def _validation_error() -> ValidationError:
    try:
        _Positive(n="many")  # type: ignore[arg-type]
    except ValidationError as e:
        return e
    raise AssertionError("not refused")


PERMANENT = {
    "usage": OptionError("quality", "quality=0 must be an int in 1..100 (default 90)"),
    "validation": _validation_error(),
    "untrusted-document": ValueError("pointer names sha256 'zz', not 64 hex digits"),
    "integrity": IntegrityError("/labels[3] = 12 out of range"),
    "checksum": ChecksumError("sha256 differs"),
    "unsafe-archive": UnsafeArchiveError("member ../x escapes the folder"),
    "download-refused": DownloadRefusedError("refusing to follow a redirect 'a' -> 'ftp://b'"),
    "missing-extra": MissingExtraError("install h5forge[s3]"),
    "destination-exists": DestinationExistsError("out.h5"),
    "not-found": FileNotFoundError("no such object"),
    "forbidden": PermissionError("403"),
    "no-such-host": socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
}
TRANSIENT = {
    "reset": ConnectionResetError("peer reset"),
    "timeout": TimeoutError("read timed out"),
    "io": OSError(5, "Input/output error"),
    "dns-down": socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
}


@task(name="fails", **with_retries(RETRIES))
def _fails(kind: str) -> None:
    raise {**PERMANENT, **TRANSIENT}[kind]


@flow
def _one_task(kind: str) -> Any:
    # No wait between attempts here; the policy (which errors) is what is under test.
    return _fails.with_options(retry_delay_seconds=0)(kind, return_state=True)


@pytest.mark.parametrize(
    ("kind", "attempts"),
    [*((k, 1) for k in PERMANENT), *((k, 1 + RETRIES) for k in TRANSIENT)],
)
def test_a_task_is_retried_only_when_a_retry_can_help(
    prefect_harness: str, kind: str, attempts: int
) -> None:
    state = _one_task(kind, return_state=True)
    assert state.is_failed()
    [run] = flow_run_task_runs(state.state_details.flow_run_id)
    assert run.run_count == attempts, (kind, run.run_count)


@pytest.mark.parametrize("kind", sorted(PERMANENT))
def test_the_policy_names_each_permanent_error(kind: str) -> None:
    assert not is_transient(PERMANENT[kind])


def _pipeline_tasks() -> list[Task[Any, Any]]:
    found = []
    for info in pkgutil.iter_modules(h5forge.tasks.__path__, "h5forge.tasks."):
        module = importlib.import_module(info.name)
        found += [v for v in vars(module).values() if isinstance(v, Task)]
    return found


def test_every_retrying_task_follows_the_one_policy() -> None:
    tasks = _pipeline_tasks()
    assert {"fetch", "fingerprint", "read-sidecar"} <= {t.name for t in tasks}
    retrying = [t for t in tasks if t.retries]
    assert retrying
    for t in retrying:
        assert t.retry_condition_fn in (retry_if_transient, retry_upload), t.name
    # Tasks made per call (publish's materialize) get theirs from with_retries too: no module
    # of the task layer or above sets retries itself.
    for folder in ("tasks", "flows", "deployments"):
        for path in (ROOT / folder).glob("*.py"):
            if path.name != "common.py":
                assert "retries=" not in path.read_text(encoding="utf-8"), path

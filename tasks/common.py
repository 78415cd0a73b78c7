"""What the stage tasks share: run names that show the dataset, and when a retry is worth it.

One retry policy for every task (:func:`with_retries`): an error that a retry cannot fix fails
the task at its first attempt (:data:`PERMANENT`: invalid arguments and options, an untrusted
document refused, a checksum or integrity failure, an unsafe archive, a missing extra, a
destination that exists, a path that is not there or not allowed, a host name that does not
exist); anything else (network, timeouts, a flaky store, a full disk freed meanwhile) is
retried with jittered exponential backoff. A test holds every task to it.
"""

from __future__ import annotations

import posixpath
import socket
from typing import Any

from prefect import runtime
from prefect.client.schemas.objects import TaskRun
from prefect.states import State
from prefect.tasks import exponential_backoff

from h5forge.errors import ChecksumError, H5ForgeError
from h5forge.redact import redact_url

__all__ = [
    "PERMANENT",
    "RETRY_BACKOFF_S",
    "RETRY_JITTER",
    "dataset_name",
    "is_transient",
    "retry_if_transient",
    "retry_upload",
    "run_name",
    "with_retries",
]

# Exponential backoff base (1st retry after ~2 s, then 4 s, 8 s ...) and its random spread, so
# many flows hitting the same flaky endpoint do not retry in lock-step.
RETRY_BACKOFF_S = 2.0
RETRY_JITTER = 0.5

# Task parameters that name the dataset a task works on, most specific first.
_NAME_PARAMS = ("destination", "url", "out", "path", "where", "source", "root", "dest")


def dataset_name(url: str) -> str:
    """A short, credential-free name for a dataset URL: the last path component."""
    clean = redact_url(str(url)).split("?", 1)[0].rstrip("/")
    return posixpath.basename(clean) or clean


def _flow_dataset() -> str | None:
    """The dataset of the enclosing flow run: its config's destination, or its ``url``."""
    params = runtime.flow_run.parameters or {}
    config = params.get("config")
    dest = (
        config.get("destination")
        if isinstance(config, dict)
        else getattr(config, "destination", None)
    )
    dest = dest or params.get("url")
    return dataset_name(str(dest)) if dest else None


def run_name(stage: str) -> Any:
    """A ``task_run_name`` callable giving ``stage[dataset]``, e.g. ``pack[imagenet-1k.h5]``.

    The dataset is the enclosing flow's destination (so every stage of one build carries the
    same name, even those that see only a cache folder), else the task's own path parameter.
    """

    def _name() -> str:
        dataset = _flow_dataset()
        if dataset is None:
            params = runtime.task_run.parameters
            key = next((k for k in _NAME_PARAMS if params.get(k)), None)
            dataset = dataset_name(str(params[key])) if key else None
        return f"{stage}[{dataset}]" if dataset else stage

    _name.__name__ = f"{stage}_run_name"
    return _name


#: Errors that fail the same way on every attempt. h5forge's own errors are all here
#: (:class:`h5forge.errors.H5ForgeError`: IntegrityError, ChecksumError, UnsafeArchiveError,
#: MissingExtraError, DestinationExistsError, ...), and so are ValueError (OptionError, a
#: pydantic ValidationError, a refused document) and ImportError.
PERMANENT: tuple[type[BaseException], ...] = (
    H5ForgeError,
    ValueError,
    TypeError,
    LookupError,
    ImportError,
    NotImplementedError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)
# The resolver's "no such host" (a typo), unlike EAI_AGAIN ("try again": DNS is down).
_NO_SUCH_HOST = frozenset(
    code for code in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)) if code is not None
)


def is_transient(exc: BaseException | None) -> bool:
    """Whether another attempt may succeed where ``exc`` failed (see :data:`PERMANENT`)."""
    if isinstance(exc, socket.gaierror):
        return exc.errno not in _NO_SUCH_HOST
    return not isinstance(exc, PERMANENT)


def retry_if_transient(task: Any, task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect's ``retry_condition_fn`` of :func:`with_retries`: retry I/O failures (network,
    timeouts, a flaky store), never a failure retrying cannot fix (:func:`is_transient`)."""
    return is_transient(state.result(raise_on_failure=False))


def with_retries(retries: int = 3, condition: Any = None) -> dict[str, Any]:
    """``@task`` keyword arguments: ``retries`` retries with jittered exponential backoff, only
    when ``condition`` (default :func:`retry_if_transient`) says a retry can help."""
    return {
        "retries": retries,
        "retry_delay_seconds": exponential_backoff(backoff_factor=RETRY_BACKOFF_S),
        "retry_jitter_factor": RETRY_JITTER,
        "retry_condition_fn": condition or retry_if_transient,
    }


def retry_upload(task: Any, task_run: TaskRun, state: State[Any]) -> bool:
    """Like :func:`retry_if_transient`, and also retry a failed read-back after an upload.

    A published object whose read-back digest differs was damaged in transit; the publisher
    has deleted it, so uploading again is the fix.
    """
    exc = state.result(raise_on_failure=False)
    return isinstance(exc, ChecksumError) or is_transient(exc)

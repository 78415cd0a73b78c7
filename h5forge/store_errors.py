"""What a remote store's failure means to a reader, said once: :class:`StoreError`.

A remote read is retried by the store's client before h5forge sees an error (for ``s3://``:
botocore's policy, :data:`h5forge.location.S3_RETRIES` unless the storage options set one,
inside s3fs's own 5 tries of a throttled or dropped request). What reaches h5forge is the
client's last error, in the client's words ("[Errno 16] Please reduce your request rate.",
"Response payload is not completed"), without the URL. :func:`explain` turns an error that
says the store failed (throttled, a 5xx answer, a connection dropped mid-answer, a timeout)
into a :class:`StoreError` naming the URL, the bytes, what failed, the attempts made and the
option that allows more; any other error (no such file, access denied) is not a store
failure and is left as it is. :func:`store_failures` does it for a block of code.

The client's classes are recognised by name (botocore, aiohttp, s3fs are optional extras):
nothing here imports them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

from h5forge.errors import StoreError

if TYPE_CHECKING:
    from h5forge.location import Location

__all__ = ["MIN_READ_RATE", "explain", "store_failures"]

#: The slowest a remote store may send what h5forge asked for, in bytes per second of one call,
#: beyond the time its client's own attempts may take
#: (:meth:`h5forge.location.Location.read_timeout`): an answer trickled a byte at a time within
#: each read timeout is cut off, and is a store failure ("sent its answer too slowly").
MIN_READ_RATE = 128 << 10


# Client error classes (by name, anywhere in an error's class hierarchy or cause chain).
_DROPPED = frozenset(
    {
        "ClientPayloadError",  # aiohttp: fewer body bytes than Content-Length
        "IncompleteRead",
        "ServerDisconnectedError",
        "ConnectionClosedError",  # botocore
        "ConnectionResetError",
        "ConnectionAbortedError",
        "BrokenPipeError",
    }
)
_TIMEOUTS = frozenset(
    {
        "TimeoutError",
        "ReadTimeoutError",  # botocore
        "ConnectTimeoutError",
        "ServerTimeoutError",  # aiohttp
    }
)
_UNREACHABLE = frozenset({"EndpointConnectionError", "ClientConnectorError"})
# Answers a store gives when it is overloaded or failing, not when the request is wrong.
_RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# What s3fs tries again itself (its _error_wrapper), besides the errors above.
_S3FS_THROTTLED = ("SlowDown", "reduce your request rate")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes, nearest first (a few levels: clients wrap once or twice)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 8:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]


def _names(exc: BaseException) -> set[str]:
    return {c.__name__ for c in type(exc).__mro__}


def _answer(exc: BaseException) -> tuple[int, str, int | None] | None:
    """``(HTTP status, error code, requests made)`` of a store's error answer, or None."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping) and isinstance(response.get("ResponseMetadata"), Mapping):
        meta = response["ResponseMetadata"]  # botocore's ClientError
        code = str((response.get("Error") or {}).get("Code", ""))
        retried = meta.get("RetryAttempts")
        status = meta.get("HTTPStatusCode")
        if isinstance(status, int):
            return status, code, retried + 1 if isinstance(retried, int) else None
    status = getattr(exc, "status", None)  # aiohttp's ClientResponseError (http(s)://)
    if isinstance(status, int) and "ClientResponseError" in _names(exc):
        return status, str(getattr(exc, "message", "")), None
    return None


class _Failure(NamedTuple):
    said: str  # what the store did ("answered 503 SlowDown")
    kind: str  # throttled | error (a 5xx answer) | dropped | timeout | slow
    requests: int | None  # HTTP requests of the client's last try (botocore's count)
    tried_again: bool  # whether s3fs tries it again itself (its _error_wrapper)


def _failure(exc: BaseException) -> _Failure | None:
    """What the store did, or None: ``exc`` is no store failure."""
    for e in _chain(exc):
        answer = _answer(e)
        if answer is not None:
            status, code, requests = answer
            if status not in _RETRYABLE_STATUS:
                return None  # 403, 404 ...: the request, not the store
            said = f"{status} {code}".strip() if code and code != str(status) else str(status)
            kind = "throttled" if status in (429, 503) else "error"
            # s3fs matches the text of the answer: a HEAD's 503 has none, so is not tried again
            again = any(p in str(e) for p in _S3FS_THROTTLED)
            return _Failure(f"answered {said}", kind, requests, again)
    for e in _chain(exc):
        names, said = _names(e), f"({type(e).__name__}: {e})"
        if "FSTimeoutError" in names:  # h5forge's bound on the whole call (read_timeout)
            return _Failure("sent its answer too slowly", "slow", None, False)
        if names & _DROPPED:
            return _Failure(f"dropped the connection mid-answer {said}", "dropped", 1, True)
        if names & _TIMEOUTS:
            return _Failure(f"timed out {said}", "timeout", 1, True)
        if names & _UNREACHABLE:
            return _Failure(f"could not be reached {said}", "timeout", 1, True)
    return None


def _retries(where: Location) -> int | None:
    """botocore's retries a request of ``where``'s client makes, if its options say."""
    config = where.client_options.get("config_kwargs") or {}
    retries = config.get("retries") if isinstance(config, Mapping) else None
    if not isinstance(retries, Mapping):
        return None
    if isinstance(retries.get("max_attempts"), int):
        return int(retries["max_attempts"])
    if isinstance(retries.get("total_max_attempts"), int):
        return int(retries["total_max_attempts"]) - 1
    return None


def explain(exc: BaseException, where: Location, *, what: str, seconds: float) -> StoreError | None:
    """The :class:`StoreError` that ``exc`` (raised reading ``what`` of ``where`` for
    ``seconds``) means, or None when ``exc`` is no store failure (raise it as it is).

    Attempts are counted as the client makes them: s3fs tries a dropped or timed out request,
    or one answered ``SlowDown``, ``S3FileSystem.retries`` times, each try botocore's attempts
    (the last try's are in its answer); other errors get one try of botocore's attempts.
    """
    if isinstance(exc, StoreError):
        return exc
    found = _failure(exc)
    if found is None:
        return None
    said, kind, requests, again = found
    retries = _retries(where)
    s3 = where.protocol in ("s3", "s3a")
    tries = int(getattr(where.fs, "retries", 1)) if s3 and again else 1
    if kind == "slow":
        attempts = "every attempt its client may make"
    elif requests is None or requests == 1:
        attempts = f"{tries} attempt{'s' if tries > 1 else ''}"
    elif tries == 1:
        attempts = f"{requests} attempts"
    else:
        attempts = f"{tries} tries of {requests} attempts each ({tries * requests} requests)"
    more = 2 * retries if retries else 6
    if kind in ("throttled", "error"):
        fix = (
            "read again later or with fewer workers, or allow more retries: storage_options="
            f"{{'config_kwargs': {{'retries': {{'mode': 'standard', 'max_attempts': {more}}}}}}}"
            f" (now {'the client default' if retries is None else retries})"
        )
    else:
        fix = (
            "check the network path to the store; a slow store may need a longer "
            "storage_options={'config_kwargs': {'read_timeout': SECONDS}}"
        )
        if kind == "slow":
            fix += (
                ", which lengthens that bound too (the client's attempts, each its timeouts, "
                f"and the bytes at {MIN_READ_RATE >> 10} KiB/s)"
            )
    reason = {
        "throttled": "the store is throttling requests",
        "error": "the store is failing",
        "dropped": "the network or the store cut the answer short",
        "timeout": "the store did not answer in time",
        "slow": "the read took longer than the most h5forge waits for it",
    }[kind]
    return StoreError(
        f"{where}: reading {what} failed after {attempts} over {seconds:.1f} s: the store "
        f"{said}; {reason}, nothing is wrong with the asset. To fix: {fix}"
    )


@contextmanager
def store_failures(where: Location, what: str) -> Iterator[None]:
    """Raise the :class:`StoreError` an error in the block means (see :func:`explain`); any
    other error passes as it is."""
    started = time.monotonic()
    try:
        yield
    except Exception as e:
        err = explain(e, where, what=what, seconds=time.monotonic() - started)
        if err is None or err is e:
            raise
        raise err from e

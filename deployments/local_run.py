"""Run the ``build-h5-dataset`` flow in this process for ``h5forge build`` and ``demo``.

``PREFECT_API_URL``, when set, names the server. Otherwise the run uses the persistent server of
``h5forge server start`` (:mod:`h5forge.deployments.server`) when it is up, else gets its own
temporary server (:mod:`h5forge.deployments.temporary_server`), saying once how to get the
persistent one; either way ``PREFECT_API_URL`` is set before Prefect is imported, so that
Prefect's settings see it. A failure becomes an exit code and one paragraph, without a traceback
(``--debug`` shows it); the exit codes are the table of :mod:`h5forge.cli.exits`.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from h5forge.cli.exits import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, fail, usage_error
from h5forge.deployments.server import running_server
from h5forge.deployments.settings import cache_dir_from_env
from h5forge.deployments.temporary_server import (
    STARTUP_SETTING,
    ServerStartError,
    start_temporary_server,
)
from h5forge.errors import DestinationExistsError, H5ForgeError, PreviewPublishError
from h5forge.main_guard import check_entry_point
from h5forge.messages import describe_os_error, os_error_in
from h5forge.redact import redact_text
from h5forge.text import printable

__all__ = ["EPHEMERAL_STARTUP_TIMEOUT_S", "run_build"]

# How long build and demo wait for their temporary Prefect server unless STARTUP_SETTING is
# set: a first start (it creates its SQLite database) took over 20 s, Prefect's default, on a
# 2-core machine with a load of ~3.
EPHEMERAL_STARTUP_TIMEOUT_S = 180.0
# A command ended by SIGINT exits 128 + 2, as the shell reports one the signal killed.


class _NoTraceback(logging.Formatter):
    """Console formatter that leaves tracebacks out (the API log handler still records them)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self._inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            # A copy, so the handlers that run after this one still see the traceback.
            record = logging.makeLogRecord(
                {**record.__dict__, "exc_info": None, "exc_text": None, "stack_info": None}
            )
        return self._inner.format(record)


def _quiet_console_tracebacks() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [
        logging.getLogger(),
        *(
            logging.getLogger(name)
            for name in list(logging.root.manager.loggerDict)
            if name.startswith("prefect")
        ),
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler) and not isinstance(
                handler.formatter, _NoTraceback
            ):
                handler.setFormatter(_NoTraceback(handler.formatter))


def _startup_bound() -> float:
    """Seconds to wait for the temporary server: the user's setting, else our default."""
    raw = os.environ.get(STARTUP_SETTING)
    if raw is None:
        return EPHEMERAL_STARTUP_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise fail(
            f"{STARTUP_SETTING}={printable(raw)} is not a number of seconds", EXIT_USAGE
        ) from None


def run_build(config: Any, cache_dir: Path | None, debug: bool) -> Any:
    """Run the flow on ``config``; map failures to an exit code and one paragraph.

    Args:
        config: a validated :class:`h5forge.flows.config.BuildConfig`.
        cache_dir: the fetch cache; default ``$XDG_CACHE_HOME/h5forge`` (else the flow's own
            default, ``~/.cache/h5forge``).
        debug: let unexpected errors through with their traceback.

    Returns:
        The flow's :class:`h5forge.flows.build.BuildSummary`.

    Raises:
        typer.Exit: the run failed (exit 1) or was refused (exit 2); the reason is printed.
    """
    check_entry_point("run_build")
    # Registered before Prefect is imported, so it runs after Prefect's exit hooks (last
    # registered, first run) have delivered the run's logs: the interpreter's shutdown then
    # skips its final garbage collection over everything torch and Prefect imported, 1-2 s of
    # CPU on a busy 2-core machine for a command that is done (objects are still freed by
    # reference counting; every file was closed by the flow).
    atexit.register(gc.freeze)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    cache = cache_dir or cache_dir_from_env(os.environ)
    if os.environ.get("PREFECT_API_URL"):  # the user's choice wins
        return _run_flow(config, cache, debug)
    server = running_server(os.environ)
    if server is not None:
        typer.echo(f"using the h5forge server at {server.ui_url}", err=True)
        os.environ["PREFECT_API_URL"] = server.url  # before Prefect is imported: it reads it once
        return _run_flow(config, cache, debug)
    typer.echo(
        "no h5forge server is running: this run starts a temporary one (about 20 s) whose links "
        "end with it; `h5forge server start` keeps one running for every build, UI included",
        err=True,
    )
    try:
        start_temporary_server(_startup_bound(), lambda line: typer.echo(line, err=True))
    except ServerStartError as e:
        raise fail(str(e), EXIT_FAILURE) from e
    return _run_flow(config, cache, debug)


def _run_flow(config: Any, cache_dir: Path | None, debug: bool) -> Any:
    from h5forge.flows.build import build_dataset

    if not debug:
        _quiet_console_tracebacks()
    try:
        return build_dataset(config, cache_dir=str(cache_dir) if cache_dir else None)
    except KeyboardInterrupt as e:  # Ctrl-C: the pools and the server are ended on the way out
        raise fail("interrupted (Ctrl-C) before the build finished", EXIT_INTERRUPTED) from e
    except DestinationExistsError as e:
        raise usage_error(e) from e
    except PreviewPublishError as e:  # the asset is there: say so, not "nothing was published"
        raise fail(f"build failed after publishing: {redact_text(str(e))}", EXIT_FAILURE) from e
    except (FileExistsError, FileNotFoundError, ValidationError) as e:
        raise usage_error(_redacted(e)) from e
    except OSError as e:
        raise fail(
            f"build failed, nothing was published: "
            f"{redact_text(describe_os_error(e, overwrite_flag='--overwrite'))}",
            EXIT_FAILURE,
        ) from e
    except H5ForgeError as e:
        cause = os_error_in(e)
        text = describe_os_error(cause) if cause is not None else str(e)
        raise fail(f"build failed, nothing was published: {redact_text(text)}", EXIT_FAILURE) from e
    except ValueError as e:
        raise fail(redact_text(str(e)), EXIT_USAGE) from e
    except Exception as e:  # noqa: BLE001 - the CLI's job: one paragraph instead of a traceback
        if debug:
            raise
        cause = os_error_in(e)
        text = (
            describe_os_error(cause)
            if cause is not None
            else (f"{type(e).__name__}: {redact_text(str(e))}")
        )
        raise fail(
            f"build failed, nothing was published: {text} (run with --debug for the traceback)",
            EXIT_FAILURE,
        ) from e


def _redacted(e: BaseException) -> BaseException:
    """``e`` with its message redacted, for a usage line (same type, errno kept)."""
    text = describe_os_error(e) if isinstance(e, OSError) else str(e)
    new = type(e)(redact_text(text)) if isinstance(e, OSError) else ValueError(redact_text(text))
    return new

"""The command line's exit codes, and how an error becomes one message and one of them.

====  ===========================================================================
0     success
1     integrity or run failure: a file failed its checks or disagrees with its
      sidecar, too many images were quarantined, the disk filled up mid-run
2     usage: a bad option or value, a source that does not exist, a destination
      that exists (without ``--overwrite``), is read-only, full, or inside the source
130   interrupted (Ctrl-C): ``build``, ``demo`` and ``serve`` stop what they started
====  ===========================================================================

Every error a command reports (``pack``, ``verify``, ``inspect``, ``build``, ``demo``) goes
through :func:`fail`: one message on stderr, control characters escaped, no traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer

from h5forge.errors import (
    BusyError,
    DestinationExistsError,
    H5ForgeError,
    IntegrityError,
    MissingExtraError,
    TooManyBadImagesError,
)
from h5forge.messages import describe_os_error, os_error_in
from h5forge.options import OptionError, option
from h5forge.text import printable

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTEGRITY",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "fail",
    "run_guarded",
    "usage_error",
]

EXIT_OK = 0
EXIT_FAILURE = 1  # integrity or run failure
EXIT_INTEGRITY = EXIT_FAILURE
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it


def fail(message: str, code: int) -> typer.Exit:
    """Print ``message`` to stderr (control characters escaped) and return the Exit to raise."""
    # Line by line: a multi-line report keeps its lines; no terminal control gets through.
    # Only what is not printable is escaped here: names the message already passed through
    # printable() keep their single backslashes.
    safe = "\n".join(
        "".join(ch if ch.isprintable() else printable(ch) for ch in line)
        for line in message.splitlines() or [""]
    )
    typer.secho(f"error: {safe}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


def usage_error(e: BaseException) -> typer.Exit:
    """The exit for an error found before any work (a bad argument or path): exit 2."""
    if isinstance(e, DestinationExistsError):
        return fail(f"{e.url} already exists; pass --overwrite to replace it", EXIT_USAGE)
    if isinstance(e, OptionError):
        return fail(f"invalid value for {option(e.option).flag}: {e}", EXIT_USAGE)
    text = describe_os_error(e, overwrite_flag="--overwrite") if isinstance(e, OSError) else str(e)
    # The library words the fix for Python callers; on the command line it is a flag.
    for python in ("overwrite=True (CLI: --overwrite)", "overwrite=True"):
        text = text.replace(python, "--overwrite")
    return fail(text, EXIT_USAGE)


def run_guarded(fn: Callable[..., Any], *args: Any, what: str | None = None, **kwargs: Any) -> Any:
    """Call ``fn``; turn its errors into one message and the exit-code table's code.

    Args:
        what: the path to name in an operating-system error that carries none (the output).
    """
    try:
        return fn(*args, **kwargs)
    except (IntegrityError, TooManyBadImagesError) as e:
        raise fail(str(e), EXIT_FAILURE) from e
    except (
        DestinationExistsError,
        OptionError,
        MissingExtraError,
        BusyError,
        FileExistsError,
        FileNotFoundError,
    ) as e:
        raise usage_error(e) from e
    except OSError as e:
        raise fail(
            describe_os_error(e, path=what, overwrite_flag="--overwrite"), EXIT_FAILURE
        ) from e
    except (H5ForgeError, ValueError) as e:
        cause = os_error_in(e)  # e.g. an extraction that ran out of disk
        if cause is not None:
            raise fail(describe_os_error(cause, path=what), EXIT_FAILURE) from e
        raise fail(str(e), EXIT_USAGE) from e

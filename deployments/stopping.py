"""Ctrl-C stops a long-running command on the first press, within a bound.

Prefect's runner answers SIGINT by cleaning up through its server (it pauses the served
schedules, closes its event streams). When that server is gone or slow, the clean-up waits on a
client that retries; a person pressing Ctrl-C must not have to wait for it, nor press twice.
:func:`stop_within` keeps Python's own answer to the first SIGINT (``KeyboardInterrupt``, so the
clean-up runs) and bounds it: when the clean-up has not ended after ``grace_s`` seconds, or on a
second SIGINT, the process says so in one line and exits 130 at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from h5forge.cli.exits import EXIT_INTERRUPTED

__all__ = ["SHUTDOWN_GRACE_S", "Interrupt", "stop_within"]

#: Exit status of a process ended by SIGINT, as shells report it (128 + 2).
#: Seconds the clean-up after Ctrl-C may take (pausing three schedules takes well under 2 s).
SHUTDOWN_GRACE_S = 10.0


class Interrupt:
    """Whether the process was interrupted (a SIGINT arrived) inside :func:`stop_within`."""

    def __init__(self) -> None:
        self.received = threading.Event()


def _exit_now(program: str, reason: str) -> None:
    sys.stderr.write(f"{program}: stopped at once: {reason}\n")
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)  # the clean-up is what does not return: nothing else to run


@contextlib.contextmanager
def stop_within(program: str, grace_s: float = SHUTDOWN_GRACE_S) -> Iterator[Interrupt]:
    """Within the block, the first SIGINT raises ``KeyboardInterrupt`` and starts a timer of
    ``grace_s`` seconds; the process exits 130 when the timer ends first, or on a second SIGINT.

    Only in the main thread (where Python delivers signals); elsewhere the block runs as is.

    Args:
        program: how the one line the process prints names it (``h5forge serve``).
        grace_s: the seconds the clean-up after the first SIGINT may take.
    """
    interrupt = Interrupt()
    if threading.current_thread() is not threading.main_thread():
        yield interrupt
        return
    finished = threading.Event()

    def bound() -> None:
        if not finished.wait(grace_s):
            _exit_now(program, f"Ctrl-C, and the clean-up did not end within {grace_s:g} s")

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if interrupt.received.is_set():
            _exit_now(program, "Ctrl-C pressed again")
        interrupt.received.set()
        threading.Thread(target=bound, name="stop-within", daemon=True).start()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupt
    finally:
        finished.set()
        signal.signal(signal.SIGINT, previous)

"""Worker processes that end with the process that owns them, however it ends.

A worker left behind when its owner is killed with SIGKILL (which cleans nothing up) waits
forever: on a process pool's queue, whose pipe it holds open itself, or on a DataLoader's index
queue (torch's own watchdog compares the parent pid with the one it saw when it started, and a
worker that starts after its owner died sees init there). Such workers also keep a fork server
and a resource tracker alive. So each worker watches its owner's pid (a pidfd on Linux, else a
poll) on a daemon thread and kills itself once the owner has exited; a worker whose parent is a
fork server also asks the kernel for SIGKILL when the fork server dies (``PR_SET_PDEATHSIG``;
not when the parent is the owner itself: that signal follows the *thread* that started the
worker, which may end before the worker should). A worker that exits through the interpreter's
shutdown (spawn) skips its final garbage collection, which the owner would wait out.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["end_with_owner", "worker_init"]


def end_with_owner(owner: int) -> None:
    """End this worker process as soon as ``owner`` is gone (call it first in the worker).

    A pool initializer or a DataLoader ``worker_init_fn`` (through :func:`worker_init`): module
    level, so that spawn and forkserver workers unpickle it by name.
    """
    # A spawned worker ends through the interpreter's full shutdown, whose last garbage
    # collection walks every object torch imported (0.5-1 s of CPU per worker on a busy 2-core
    # machine, which the owner waits out when it joins its workers); frozen objects are skipped,
    # and still freed by reference counting. The last exit hook, so it runs after all others.
    atexit.register(gc.freeze)
    if sys.platform.startswith("linux") and os.getppid() != owner:
        import ctypes

        # The parent is the fork server: its death kills us. Not when the parent is the owner
        # (fork, spawn): the signal follows the *thread* that started us, which may end first.
        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    pidfd = -1
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(owner)
        except ProcessLookupError:  # the owner died before this worker started
            os._exit(1)
        except OSError:  # a kernel without pidfds: poll instead
            pidfd = -1
    threading.Thread(
        target=_watch_owner, args=(owner, pidfd), daemon=True, name="h5forge-owner-watch"
    ).start()


def _watch_owner(owner: int, pidfd: int) -> None:
    if pidfd >= 0:
        select.select([pidfd], [], [])  # readable once the owner has exited
    else:
        while _alive(owner):
            time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's: our owner's pid was reused
        return False
    return True


def _init_then(owner: int, then: Callable[[int], None] | None, worker_id: int) -> None:
    end_with_owner(owner)
    if then is not None:
        then(worker_id)


def worker_init(then: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn`` that ends each worker with this process, then runs
    ``then`` (a module-level function, or None); picklable for spawn and forkserver."""
    return functools.partial(_init_then, os.getpid(), then)

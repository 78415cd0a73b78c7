"""Which start method the decode pool's worker processes use, and the checks that go with it.

fork() copies a parent that may run threads (Prefect's event loop, torch's thread pools, h5py)
and can deadlock in the child; Python 3.14 moved Linux to forkserver for this reason. So the
pool uses forkserver (spawn where it is missing) unless a start method was chosen explicitly,
and has the fork server import the decoders once.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing.context import BaseContext

__all__ = ["check_main_importable", "worker_context"]


def check_main_importable(ctx: BaseContext) -> None:
    """spawn and forkserver children re-run ``__main__`` from its file: refuse a main script
    they cannot find (``python - < script.py``) with the fix, instead of workers that die."""
    if ctx.get_start_method() == "fork":
        return
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not os.path.exists(main_file):
        raise RuntimeError(
            f"worker processes ({ctx.get_start_method()}) re-import the main script, and "
            f"{main_file!r} is not a file (a script read from stdin?); run it from a file or "
            "with python -c, or pass workers=1 to decode in this process"
        )


def worker_context() -> BaseContext:
    """The multiprocessing context for the decode pool's workers.

    An explicitly chosen start method wins; otherwise the platform default (spawn on
    macOS/Windows) unless it is fork, which is replaced by forkserver (spawn where it is
    missing). A forkserver context preloads the decoders.
    """
    chosen = multiprocessing.get_start_method(allow_none=True)
    if chosen is not None:
        return multiprocessing.get_context(chosen)
    available = multiprocessing.get_all_start_methods()  # the platform default comes first
    if available[0] != "fork":
        return multiprocessing.get_context(available[0])
    if "forkserver" not in available:
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    _preload(ctx)
    return ctx


# The pool's module: importing it imports the decode pipeline (numpy, Pillow) and the
# worker-side functions the pool pickles by name.
_PRELOAD = "h5forge.preprocess.pool"


def _preload(ctx: BaseContext) -> None:
    """Have the fork server import the decoders once, so each pool's workers start in ms.

    A worker forked from a bare fork server imports numpy, Pillow and h5forge itself (0.3 s of
    CPU each, per pack). The list is added to, never replaced; it takes effect when the fork
    server starts (the first forkserver process of this interpreter), later calls change nothing.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    current = list(getattr(server, "_preload_modules", None) or ["__main__"])
    if _PRELOAD not in current:
        ctx.set_forkserver_preload([*current, _PRELOAD])

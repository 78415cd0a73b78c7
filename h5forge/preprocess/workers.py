"""Which start method the decode pool's workers use, and the fork server they start from.

fork() copies a parent that may run threads (Prefect's event loop, torch's thread pools, h5py)
and can deadlock in the child; Python 3.14 moved Linux to forkserver for this reason. So the
pool uses forkserver (spawn where it is missing) unless a start method was chosen explicitly
(:func:`worker_context`), and has the fork server import the decoders and the main script's
modules once (:func:`_preload`). :func:`start_early` starts the fork server before the caller's
own slow imports, so that the two overlap.

Nothing heavy is imported here (no decoder, no torch): the command line starts the fork server
from here before it imports the packer.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import types
from multiprocessing.context import BaseContext

__all__ = ["POOL_FROM", "check_main_importable", "start_early", "unchoose", "worker_context"]

#: The pool starts worker processes from this many inputs: below, starting them costs more
#: than it saves (threads decode).
POOL_FROM = 8


def unchoose(chosen: str | None) -> None:
    """Undo the start method that starting the pool chose as a side effect.

    Python's ``multiprocessing`` (before 3.14) makes the platform default (fork on Linux) the
    process's chosen start method as it starts any forkserver or spawn worker
    (``spawn.get_preparation_data`` calls ``get_start_method()``). :func:`worker_context` would
    then take it for the caller's choice, and every later pool of the process would fork the
    whole parent. Nothing is undone when a start method was already chosen.
    """
    if chosen is None and multiprocessing.get_start_method(allow_none=True) is not None:
        multiprocessing.set_start_method(None, force=True)


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
    global _CHOSEN
    chosen = multiprocessing.get_start_method(allow_none=True)
    available = multiprocessing.get_all_start_methods()  # the platform default comes first
    if _CHOSEN is not None and chosen == available[0]:
        # Starting a forkserver or spawn process pins the *default* context to the platform's
        # default as a side effect (CPython's get_preparation_data asks get_start_method()):
        # that is not a choice, and the next pool would fork this (large, threaded) process,
        # its open files included. Keep what the first pool used.
        return _CHOSEN
    if chosen is not None:
        _CHOSEN = multiprocessing.get_context(chosen)
    elif available[0] != "fork":
        _CHOSEN = multiprocessing.get_context(available[0])
    elif "forkserver" not in available:
        _CHOSEN = multiprocessing.get_context("spawn")
    else:
        _CHOSEN = multiprocessing.get_context("forkserver")
        _preload(_CHOSEN)
    return _CHOSEN


_CHOSEN: BaseContext | None = None  # the context of the first pool (see worker_context)


# The pool's module: importing it imports the decode pipeline (numpy, Pillow) and the
# worker-side functions the pool pickles by name.
_PRELOAD = "h5forge.preprocess.pool"


def _preload(ctx: BaseContext) -> None:
    """Have the fork server import the decoders and what the main script imports, once, so
    each pool's workers start in ms.

    A worker forked from a bare fork server imports numpy, Pillow and h5forge itself (0.3 s of
    CPU each, per pack). Each worker also runs the main script again (as ``__mp_main__``), and
    CPython before 3.14 never has the fork server import it first (the ``__main__`` preload
    looks for a ``main_path`` the preparation data does not hold): a script that imports the
    packer, the CLI or Prefect paid those imports in every worker of every pack (0.1-0.15 s of
    CPU each for the packer, 0.9-1.2 s for Prefect and the build flow). The fork server imports the
    modules the main script's globals come from (:func:`_main_imports`), so the re-run finds
    them imported. The fork server imports from its own path (before 3.14 it never takes the
    caller's ``sys.path``): installed packages and ``PYTHONPATH``, not a module beside the
    script, which each worker still imports itself. The list is added to, never replaced; it
    takes effect when the fork server starts (the first forkserver process of this
    interpreter), later calls change nothing.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    current = list(getattr(server, "_preload_modules", None) or ["__main__"])
    wanted = [m for m in (_PRELOAD, *_main_imports()) if m not in current]
    if wanted:
        ctx.set_forkserver_preload([*current, *wanted])


def _main_imports() -> list[str]:
    """The modules that the main script's globals come from: the modules it holds and those
    that define its functions and classes (what its re-run in a worker imports). The main
    module itself is never among them (its code runs in each worker as ``__mp_main__``, under
    the name that keeps its main guard off)."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None) is None:  # the REPL, python -c
        return []
    names: set[str] = set()
    for value in list(vars(main).values()):
        name: object
        if isinstance(value, types.ModuleType):
            name = value.__name__
        elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
            name = getattr(value, "__module__", None)
        else:
            continue
        module = sys.modules.get(name) if isinstance(name, str) else None
        spec = getattr(module, "__spec__", None)
        # Only what an import by that name gives back (not a module made at run time).
        if module is not main and spec is not None and spec.name == name:
            names.add(name)
    names -= {"__main__", "__mp_main__"}
    return sorted(names)


def start_early(workers: int | None = None) -> None:
    """Start the fork server now, in the background, when the pool will use one: its imports
    (the decoders, torch: ~1 s of CPU) then run beside this process's own instead of after
    them, and the first pool finds it ready. Nothing for ``workers=1``, fork or spawn; the
    start method is left as it was found."""
    if workers == 1:
        return
    ctx = worker_context()
    if ctx.get_start_method() != "forkserver":
        return
    chosen = multiprocessing.get_start_method(allow_none=True)
    try:
        from multiprocessing import forkserver

        forkserver.ensure_running()  # spawns the server and returns; it imports on its own
    finally:
        unchoose(chosen)

"""Refuse to start processes or a server from code that every spawned child runs again.

A ``spawn`` or ``forkserver`` child (and a fork server itself) starts by importing the parent's
main script again, as ``__mp_main__``. A pipeline call at the module level of that script then
runs once more in every child: each child starts its own pool, DataLoader workers and Prefect
server while it is still bootstrapping, which ends in a misleading ``BrokenProcessPool``, a hang
or server processes left behind. Every entry point that starts processes or a server calls
:func:`check_entry_point` first, so the mistake fails at once with the fix:

- in the parent, when the call comes from the module-level code of a main script that children
  re-import (``python script.py``, ``python -m package.module``), directly or through functions,
  at a line outside any ``if __name__ == "__main__":`` (read from the script's source), the
  error is raised before anything starts;
- in a child that is re-importing the main script (multiprocessing marks that with
  ``current_process()._inheriting``, the flag its own ``_check_not_importing_main`` reads), the
  error is raised before the child starts anything, and the parent's pool reports a dead worker.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
from pathlib import Path
from types import FrameType

from h5forge.errors import MainReimportError

__all__ = ["MainReimportError", "check_entry_point", "reimport_hint"]

# The fix, shown in every message.
_FIX = """\
Put the call under a main guard, so that it runs only in the process you started:

    if __name__ == "__main__":
        main()  # the function that calls {entry}(), or the call itself
"""


def _main_script() -> str | None:
    """What children re-import as ``__mp_main__`` (a file or ``-m`` module), or None."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        return f"module {spec.name}"
    path = getattr(main, "__file__", None)
    return f"script {path}" if path else None  # -c, stdin, a REPL or a notebook: not re-run


def _main_module_frame() -> FrameType | None:
    """The frame running the main script's module-level code, if it is on this stack."""
    main = sys.modules.get("__main__")
    frame = sys._getframe(1)
    while frame is not None and main is not None:
        if frame.f_globals is vars(main) and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"``, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = {type(test.left), type(test.comparators[0])}
    values = [test.left, test.comparators[0]]
    return (
        isinstance(test.ops[0], ast.Eq)
        and sides == {ast.Name, ast.Constant}
        and any(isinstance(v, ast.Name) and v.id == "__name__" for v in values)
        and any(isinstance(v, ast.Constant) and v.value == "__main__" for v in values)
    )


def _under_main_guard(frame: FrameType) -> bool:
    """Whether the main script's module-level code is running the body of a main guard, read
    from its source; True when that cannot be read (the check in the child still applies)."""
    path, line = frame.f_code.co_filename, frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return True
    return any(
        isinstance(node, ast.If)
        and _is_main_test(node.test)
        and node.body[0].lineno <= line <= (node.body[-1].end_lineno or line)
        for node in ast.walk(tree)
    )


def check_entry_point(entry: str, *, children_reimport_main: bool = True) -> None:
    """Raise :class:`MainReimportError` if this call would run again in every spawned child.

    Call it first in an entry point that starts worker processes or a server, before it
    starts anything.

    Args:
        entry: the entry point's name as the user calls it (``build_dataset``), for the fix.
        children_reimport_main: whether the processes this call starts re-import the main
            script (``spawn``, ``forkserver``); False under ``fork``, where a module-level call
            in the parent is harmless and only the child-side check applies.

    Raises:
        MainReimportError: this process is a child re-importing the main script, or (with
            ``children_reimport_main``) the call comes from the main script's module level.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise MainReimportError(
            f"{entry}() was called while this process was starting as a child of another "
            f"({multiprocessing.current_process().name}): a spawn or forkserver child imports "
            "the main script again as __mp_main__, and this call at its module level runs in "
            "every child. " + _FIX.format(entry=entry)
        )
    if not children_reimport_main:
        return
    script = _main_script()
    frame = _main_module_frame()
    if script is not None and frame is not None and not _under_main_guard(frame):
        raise MainReimportError(
            f"{entry}() was called from the module level of the main {script} (line "
            f'{frame.f_lineno}, outside any `if __name__ == "__main__":`); the worker processes '
            "it starts (spawn or forkserver) import that script again and would run this call "
            "once more in each of them, each starting its own workers and server. "
            + _FIX.format(entry=entry)
        )


def reimport_hint(start_method: str) -> str:
    """For a worker that died at start: the main script may have failed in it (its error is
    printed above). ``""`` when children of ``start_method`` do not import it again, or when the
    main script is h5forge's own command (``h5forge``, ``python -m h5forge...``: guarded)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    path = getattr(main, "__file__", None) or ""
    own = str(getattr(spec, "name", "")).startswith("h5forge.") or Path(path).name == "h5forge"
    if start_method == "fork" or _main_script() is None or own:
        return ""
    return (
        f"; or the main {_main_script()} failed when the {start_method} worker imported it "
        "again (its error is printed above): code at its module level, a set_start_method() "
        'call included, belongs under `if __name__ == "__main__":`'
    )

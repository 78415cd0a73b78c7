"""A long-lived child process that runs calls on request and answers with their wall time
(and, where it is JSON, the call's result).

bench_pack times, in the same run and interleaved with h5forge, code that must not share its
process: the pack of an older tree of h5forge (``--baseline``: its own ``h5forge`` first on
the child's ``sys.path``) and the peer writers (LitData's ``optimize`` changes the process's
start method). The child starts once and warms up, so its start-up is not timed. The
program it runs is inline (:data:`_PROGRAM`): an older tree has no copy of this module.
bench_remote runs each reader's job in a child of its own (a fresh process, as a new training
job is, with its own environment: ``XDG_CACHE_HOME``) and reads back what the calls return.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_PROGRAM = """
import importlib, json, os, sys, time, traceback
answers = os.fdopen(os.dup(1), "w")  # the answers' channel; prints (ours, workers') go to stderr
os.dup2(2, 1)
sys.stdout = sys.stderr
for line in sys.stdin:
    call, kwargs = json.loads(line)
    module, name = call.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
        t0 = time.perf_counter()
        out = fn(**kwargs)
        seconds = time.perf_counter() - t0
    except Exception as e:
        traceback.print_exc()
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), file=answers, flush=True)
        continue
    try:
        answer = json.dumps([seconds, out])
    except (TypeError, ValueError):
        answer = json.dumps([seconds, None])
    print(answer, file=answers, flush=True)
"""


class Child:
    """``python -c _PROGRAM`` with ``path`` first on its ``sys.path``, run from ``path``;
    ``env`` is added to this process's environment (after ``PYTHONPATH``: it may set that too).

    With ``script`` (a file path), the program runs as that script instead, ``prelude`` first:
    a main script with imports of its own, as a user's is (spawn and forkserver workers run
    the main script again; ``python -c`` has none to run).
    """

    def __init__(
        self,
        path: Path,
        env: Mapping[str, str] | None = None,
        *,
        script: Path | None = None,
        prelude: str = "",
    ) -> None:
        env = {**os.environ, "PYTHONPATH": str(path), **(env or {})}
        argv = ["-c", _PROGRAM]
        if script is not None:
            script.write_text(f"{prelude}\nif __name__ == '__main__':\n" + _indented(_PROGRAM))
            argv = [str(script)]
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=path,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, call: str, **kwargs: Any) -> float:
        """Run ``module:function(**kwargs)`` there; its wall seconds."""
        return self.run(call, **kwargs)[0]

    def run(self, call: str, **kwargs: Any) -> tuple[float, Any]:
        """Run ``module:function(**kwargs)`` there; its wall seconds and its result (None
        where the result is not JSON).

        Raises:
            RuntimeError: the call raised there (its traceback is on the child's stderr), or
                the child died.
        """
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([call, kwargs]) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the child running {call} in {self.proc.args} died")
        got = json.loads(answer)
        if isinstance(got, dict):
            raise RuntimeError(f"{call} failed in the child: {got['error']}")
        seconds, out = got
        return float(seconds), out

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _indented(program: str) -> str:
    return "".join(f"    {line}\n" if line.strip() else "\n" for line in program.splitlines())

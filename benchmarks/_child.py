"""A long-lived child process that runs calls on request and answers with their wall time.

bench_pack times, in the same run and interleaved with h5forge, code that must not share its
process: the pack of an older tree of h5forge (``--baseline``: its own ``h5forge`` first on
the child's ``sys.path``) and the peer writers (LitData's ``optimize`` changes the process's
start method). The child starts once and warms up, so its start-up is not timed. The
program it runs is inline (:data:`_PROGRAM`): an older tree has no copy of this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_PROGRAM = """
import importlib, json, sys, time
for line in sys.stdin:
    call, kwargs = json.loads(line)
    module, name = call.split(":")
    fn = getattr(importlib.import_module(module), name)
    t0 = time.perf_counter()
    fn(**kwargs)
    print(json.dumps(time.perf_counter() - t0), flush=True)
"""


class Child:
    """``python -c _PROGRAM`` with ``path`` first on its ``sys.path``, run from ``path``."""

    def __init__(self, path: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(path)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROGRAM],
            cwd=path,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def call(self, call: str, **kwargs: Any) -> float:
        """Run ``module:function(**kwargs)`` there; its wall seconds."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([call, kwargs]) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the child running {call} in {self.proc.args} died")
        return float(json.loads(answer))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)

"""Campaign 7 — hostile ``.h5`` assets: every kind of :mod:`tests.fixtures.hostile_h5`, opened
by the reader (local and over loopback HTTP), ``verify`` and ``inspect`` (the library calls, and
``h5forge verify`` / ``h5forge inspect`` as subprocesses).

Requirements, per kind and entry point:

* an entry point in the kind's ``refused_by`` raises ``IntegrityError`` (``MissingExtraError``
  for a codec whose plugin is missing) whose message matches the kind's pattern; the CLI exits
  1 (2 for the missing extra) with the message and no traceback;
* no other exception type, ever (a ``MemoryError`` counts as one);
* no hang: every trial runs in a child process killed after ``trial_seconds``;
* no allocation beyond a bound: the child's address space is capped (``RLIMIT_AS``) at what it
  had mapped before the trial plus ``mem_bound``, and its peak RSS growth is recorded;
* nothing from outside the file: everything an entry point returns (class names, labels, every
  image, the summary, the preview) is searched for the secret the kinds point at.

The library trials run in a worker process that imports h5forge and torch once and forks one
child per trial (the campaign's own process runs the HTTP server thread, so it never forks).
The missing-plugin trials run in fresh interpreters where ``import hdf5plugin`` fails and
``HDF5_PLUGIN_PATH`` names an empty folder.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tests.fixtures.hostile_h5 import KINDS, SECRET, Kind, build_bases, craft, make_aux
from tests.reliability._procs import REPO
from tests.reliability._result import CampaignResult

__all__ = ["LIB_ENTRIES", "run"]

LIB_ENTRIES = ("reader", "reader-http", "verify", "inspect")
_PLUGIN_BASES = ("blosc-lz4", "zstd")
# Blocks hdf5plugin in a fresh interpreter (a None entry in sys.modules makes import fail).
_NO_PLUGIN = "import sys; sys.modules['hdf5plugin'] = None\n"


# --------------------------------------------------------------------------- trial side


def _collect(entry: str, url: str) -> list[bytes]:
    """Run one entry point on ``url``; returns every byte string it handed out."""
    seen: list[bytes] = []
    if entry in ("reader", "reader-http"):
        from h5forge.read.dataset import H5ImageDataset

        ds = H5ImageDataset(url, verify_reads=False)
        seen += [c.encode("utf-8", "surrogateescape") for c in ds.classes]
        seen.append(repr(ds.targets).encode())
        for i in range(len(ds)):
            image, label = ds[i]
            seen += [image.numpy().tobytes(), repr(label).encode()]
        ds.close()
    elif entry == "verify":
        from h5forge.verify.checks import verify

        seen.append(repr(verify(url)).encode())
    elif entry == "inspect":
        from h5forge.location import Location
        from h5forge.publish.preview import render_preview
        from h5forge.summary import summarize

        seen.append(json.dumps(summarize(Location(url)), ensure_ascii=False).encode())
        seen.append(render_preview(Location(url), n=4, tile=16).tobytes())
    else:
        raise ValueError(entry)
    return seen


def _vm_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _trial(entry: str, url: str, mem_bound: int) -> dict[str, Any]:
    """In the forked child: cap the address space, run the entry point, describe the result."""
    import resource

    from h5forge.errors import IntegrityError, MissingExtraError

    vm = _vm_kib("VmSize") * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + mem_bound, vm + mem_bound))
    rss0 = _vm_kib("VmRSS")
    out: dict[str, Any] = {"outcome": "opened", "message": "", "leak": False}
    try:
        seen = _collect(entry, url)
        out["leak"] = any(SECRET in b for b in seen)
    except MissingExtraError as e:
        out.update(outcome="MissingExtraError", message=str(e))
    except IntegrityError as e:
        out.update(outcome="IntegrityError", message=str(e))
    except BaseException as e:  # the campaign reports any other type as a failure
        out.update(outcome=type(e).__name__, message=f"{type(e).__name__}: {e}"[:2000])
    out["rss_growth_mib"] = max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    return out


def _fork_trial(entry: str, url: str, seconds: float, mem_bound: int) -> dict[str, Any]:
    """Run :func:`_trial` in a forked child; kill it after ``seconds`` (a hang)."""
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rd)
        code = 0
        try:
            data = json.dumps(_trial(entry, url, mem_bound)).encode()
            os.write(wr, data)
        except BaseException:
            code = 3
        finally:
            os._exit(code)
    os.close(wr)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                return {
                    "outcome": "hang",
                    "message": f"killed after {seconds:.0f} s",
                    "leak": False,
                    "rss_growth_mib": 0.0,
                }
            ready, _, _ = select.select([rd], [], [], left)
            if ready:
                chunk = os.read(rd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(rd)
        _, status = os.waitpid(pid, 0)
    if not chunks:
        return {
            "outcome": f"child died (status {status})",
            "message": "",
            "leak": False,
            "rss_growth_mib": 0.0,
        }
    return dict(json.loads(b"".join(chunks)))


def _worker() -> None:
    """Serve trials read from stdin as JSON lines; one forked child per trial."""
    import torch  # noqa: F401  (imported once here, not in every child)

    import h5forge.publish.preview  # noqa: F401
    import h5forge.read.dataset  # noqa: F401
    import h5forge.summary  # noqa: F401
    import h5forge.verify.checks  # noqa: F401

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        result = _fork_trial(job["entry"], job["url"], job["seconds"], job["mem_bound"])
        print(json.dumps(result), flush=True)


class _Worker:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.reliability.hostile_h5", "--worker"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError("the hostile-h5 worker did not start")

    def trial(self, entry: str, url: str, seconds: float, mem_bound: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(
            json.dumps({"entry": entry, "url": url, "seconds": seconds, "mem_bound": mem_bound})
            + "\n"
        )
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


# --------------------------------------------------------------------------- campaign side


def _env(extra_path: Path | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO) + (os.pathsep + str(extra_path) if extra_path else ""),
        "COLUMNS": "200",
    }
    return env


def _judge(
    res: CampaignResult,
    kind: Kind,
    entry: str,
    got: dict[str, Any],
    rss: list[tuple[float, str]],
    want: str = "IntegrityError",
) -> None:
    where = f"{kind.name} via {entry}"
    rss.append((float(got.get("rss_growth_mib", 0.0)), where))
    outcome, message = got["outcome"], got.get("message", "")
    must_refuse = entry.split("-")[0] in kind.refused_by
    if got.get("leak"):
        res.record(
            f"{entry}: returned data from outside the file",
            detected=False,
            lost=True,
            problem=f"{where}: returned the secret from outside the asset",
        )
    elif outcome == want and re.search(kind.match, message):
        res.record(f"{entry}: {want} naming the problem", detected=True)
    elif outcome == want:
        res.record(
            f"{entry}: {want}, unclear message",
            detected=False,
            problem=f"{where}: message does not match {kind.match!r}: {message[:300]}",
        )
    elif outcome == "opened" and not must_refuse:
        res.record(f"{entry}: opened (harmless to it, nothing from outside)", detected=True)
    elif outcome == "opened":
        res.record(
            f"{entry}: NOT REFUSED",
            detected=False,
            lost=True,
            problem=f"{where}: opened without an error",
        )
    else:
        res.record(
            f"{entry}: {outcome}", detected=False, problem=f"{where}: {outcome}: {message[:300]}"
        )


def _cli(
    kind: Kind,
    path: Path,
    res: CampaignResult,
    env: dict[str, str],
    seconds: float,
    want_codes: tuple[int, ...] = (1,),
    want: str = "IntegrityError",
) -> None:
    for command in ("verify", "inspect"):
        entry = f"cli-{command}"
        must = command in kind.refused_by
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "h5forge.cli", command, str(path)],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=seconds,
            )
        except subprocess.TimeoutExpired:
            res.record(
                f"{entry}: hang",
                detected=False,
                problem=f"{kind.name} via {entry}: no exit after {seconds:.0f} s",
            )
            continue
        text = proc.stdout + proc.stderr
        if "Traceback" in text:
            res.record(
                f"{entry}: traceback",
                detected=False,
                problem=f"{kind.name} via {entry}: traceback: {text[-400:]}",
            )
        elif SECRET.decode() in text:
            res.record(
                f"{entry}: printed data from outside the file",
                detected=False,
                lost=True,
                problem=f"{kind.name} via {entry}: printed the secret",
            )
        elif proc.returncode in want_codes and re.search(kind.match, proc.stderr):
            res.record(f"{entry}: exit {proc.returncode}, {want} naming the problem", detected=True)
        elif proc.returncode == 0 and not must:
            res.record(f"{entry}: exit 0 (harmless to it)", detected=True)
        else:
            res.record(
                f"{entry}: exit {proc.returncode}",
                detected=False,
                problem=f"{kind.name} via {entry}: exit {proc.returncode}: {proc.stderr[-300:]}",
            )


def _plugin_kinds() -> list[Kind]:
    return [
        Kind(
            f"plugin-missing-{name}",
            name,
            lambda h, a: None,
            r"pip install 'h5forge\[plugins\]'",
            f"a {name} file read where hdf5plugin cannot be imported",
        )
        for name in _PLUGIN_BASES
    ]


_PLUGIN_TRIAL = (
    _NO_PLUGIN
    + """
import json, sys
import torch, h5forge.read.dataset, h5forge.publish.preview, h5forge.summary, h5forge.verify.checks
from tests.reliability.hostile_h5 import _trial
print(json.dumps(_trial(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
"""
)


def _plugin_missing(
    kind: Kind,
    path: Path,
    work: Path,
    res: CampaignResult,
    seconds: float,
    mem_bound: int,
    rss: list[tuple[float, str]],
    cli: bool,
) -> None:
    empty = work / "no-plugins"
    empty.mkdir(exist_ok=True)
    site = work / "block-hdf5plugin"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_NO_PLUGIN)
    env = {**_env(site), "HDF5_PLUGIN_PATH": str(empty)}
    for entry in ("reader", "verify", "inspect"):
        try:
            proc = subprocess.run(
                [sys.executable, "-c", _PLUGIN_TRIAL, entry, str(path), str(mem_bound)],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=seconds,
            )
            got = json.loads(proc.stdout.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as e:
            got = {"outcome": type(e).__name__, "message": str(e)}
        _judge(res, kind, entry, got, rss, want="MissingExtraError")
    if cli:
        _cli(kind, path, res, env, seconds, want_codes=(1, 2), want="MissingExtraError")


def run(
    *,
    work: Path,
    kinds: Iterable[str] | None = None,
    cli: bool = True,
    http: bool = True,
    plugins: bool = True,
    trial_seconds: float = 60.0,
    mem_bound: int = 512 << 20,
    log: Callable[[str], None] = lambda s: None,
) -> CampaignResult:
    """Craft every kind (or those named), open each through every entry point, judge it."""
    from tests.reliability._servers import loopback_http

    t0 = time.perf_counter()
    res = CampaignResult("hostile-h5")
    work.mkdir(parents=True, exist_ok=True)
    aux = make_aux(work / "aux")
    bases = build_bases(work)
    chosen = [k for k in KINDS if kinds is None or k.name in set(kinds)]
    rss: list[tuple[float, str]] = []
    fifo_asset = Kind(
        "asset-is-a-fifo",
        "decoded",
        lambda h, a: None,
        r"not a regular file",
        "the asset path itself is a FIFO",
    )
    worker = _Worker(_env())
    try:
        with loopback_http() as server:
            for kind in [*chosen, fifo_asset] if kinds is None else chosen:
                if kind is fifo_asset:
                    path = aux / "fifo"
                else:
                    path = craft(kind, bases[kind.base], work / f"{kind.name}.h5", aux)
                    server.serve(f"/{kind.name}.h5", path.read_bytes())
                for entry in LIB_ENTRIES:
                    if entry == "reader-http" and (not http or kind is fifo_asset):
                        continue
                    url = server.url(f"/{kind.name}.h5") if entry == "reader-http" else str(path)
                    got = worker.trial(entry.replace("-http", ""), url, trial_seconds, mem_bound)
                    _judge(res, kind, entry, got, rss)
                if cli:
                    _cli(kind, path, res, _env(), trial_seconds)
                log(f"  {kind.name}: done ({res.trials} trials so far)")
    finally:
        worker.close()
    if plugins and kinds is None:
        for kind in _plugin_kinds():
            _plugin_missing(kind, bases[kind.base], work, res, trial_seconds, mem_bound, rss, cli)
    n_kinds = len(chosen) + (1 + len(_PLUGIN_BASES) * plugins if kinds is None else 0)
    res.notes.append(
        f"{n_kinds} kinds x entry points (reader local and over loopback HTTP, "
        "verify, inspect + preview; CLI verify and inspect)"
    )
    top, where = max(rss, default=(0.0, "-"))
    res.notes.append(
        f"address space capped at +{mem_bound >> 20} MiB per trial; largest peak "
        f"RSS growth of a trial {top:.1f} MiB ({where})"
    )
    res.seconds = time.perf_counter() - t0
    return res


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        _worker()

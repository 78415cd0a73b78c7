"""The console script end to end: ``h5forge build`` against ``h5forge pack``, whole processes.

Issue 26's target: with the persistent server of ``h5forge server start`` running, ``h5forge
build SRC DEST.h5`` (fetch, discover, pack, verify, smoke-load, preview, publish, report: every
stage) takes at most ``h5forge pack SRC OUT.h5`` + 10 s, medians of 5 whole-process runs,
interleaved in one run. The build without a server (each command starts and stops its own
temporary server, the first run of a fresh ``PREFECT_HOME`` left out as for the served one) is
reported beside them, no target.

Each run is a fresh ``python -m h5forge.deployments.cli`` process (imports, Prefect settings,
everything a user pays) with its own ``PREFECT_HOME`` shared by the server and the builds, and
a fresh destination.

    python -m benchmarks.bench_cli_build --count 100 --repeat 5
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._common import image_root, interleave, median, parser, start_report, table

TARGET_S = 10.0


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        XDG_CACHE_HOME=str(home / "xdg-cache"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        **extra,
    )
    return env


def _cli(*args: str, env: dict[str, str]) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "h5forge.deployments.cli", *args],
        env=env,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise SystemExit(f"h5forge {' '.join(args)} failed ({run.returncode}):\n{run.stderr}")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.set_defaults(count=100, repeat=5)
    p.add_argument("--port", type=int, default=4219, help="the persistent server's port")
    args = p.parse_args()
    report = start_report("console script: build (persistent server) vs pack, whole processes")
    root, what = image_root(args)
    tmp = Path(tempfile.mkdtemp(prefix="h5forge-bench-cli-"))
    served = _env(tmp / "home")
    bare = _env(tmp / "home-bare")
    counter = iter(range(10**6))

    def fresh(name: str) -> str:
        return str(tmp / f"{name}-{next(counter)}" / "out.h5")

    _cli("server", "start", "--port", str(args.port), env=served)
    try:
        for env in (served, bare):  # a first run creates the database: not what is measured
            _cli("build", str(root), fresh("warm"), env=env)
        variants = {
            "pack": lambda: _cli("pack", str(root), fresh("pack"), env=served),
            "build, server running": lambda: _cli("build", str(root), fresh("build"), env=served),
            "build, no server": lambda: _cli("build", str(root), fresh("bare"), env=bare),
        }
        times = interleave(variants, args.repeat)
    finally:
        _cli("server", "stop", env=served)
        shutil.rmtree(tmp, ignore_errors=True)
    pack, build = median(times["pack"]), median(times["build, server running"])
    report.add(
        f"Input: {what}. Each run a fresh `python -m h5forge.deployments.cli` process; "
        f"medians of {args.repeat}, the three interleaved.\n"
    )
    report.add(
        table(
            ["command", "median s", "all runs s"],
            [[name, median(ts), ", ".join(f"{t:.1f}" for t in ts)] for name, ts in times.items()],
        )
    )
    gap = build - pack
    ok = "PASS" if gap <= TARGET_S else "MISS"
    report.add(
        f"\n- build (server running) - pack = **{gap:+.1f} s**, {ok} (<= {TARGET_S:g} s)"
        f"\n- build without a server - pack = {median(times['build, no server']) - pack:+.1f} s,"
        " reported, no target"
    )
    report.write(not args.no_record)


if __name__ == "__main__":
    main()

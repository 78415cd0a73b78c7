"""The ``h5forge`` console script: the library's commands plus ``build`` and ``demo`` (Prefect).

Its app is its own: the library's commands (``pack``, ``verify``, ``inspect`` of
:data:`h5forge.cli.app.app`, which stays Prefect-free) are added to it unchanged, and ``build`` and
``demo`` are registered on it here, explicitly. Run it as ``h5forge`` or
``python -m h5forge.deployments.cli``.

``build`` and ``demo`` run the ``build-h5-dataset`` flow in this process
(:mod:`h5forge.deployments.local_run`). With no ``PREFECT_API_URL`` set, a temporary local server is
started for the run and stopped at the end, so both work offline on a fresh machine.

Exit codes (the table of :mod:`h5forge.cli.exits`): 0 success; 1 the build or an integrity check
failed; 2 usage error (bad option, a local source that is not there, a destination that exists
without ``--overwrite``, is read-only, full or inside the source, unknown credentials block).
Every argument is checked before Prefect is imported, by the checks ``pack`` makes too
(:mod:`h5forge.cli.inputs`), so a usage error costs well under a second, not the ~18 s of
starting Prefect, and the same mistake gets the same line from both. ``h5forge --version``
prints the program's version; ``--version`` after ``verify`` or ``inspect`` picks an asset's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from h5forge.cli.app import app as library_app
from h5forge.cli.app import program_version
from h5forge.cli.exits import EXIT_FAILURE, EXIT_USAGE, fail, usage_error
from h5forge.cli.inputs import check_options, check_paths, start_workers_early
from h5forge.cli.options import with_pack_options
from h5forge.deployments.build_options import (
    CacheDir,
    CredentialsBlock,
    DaskAddress,
    Debug,
    DemoDest,
    Dest,
    Executor,
    ExecutorChoice,
    KeepVersions,
    MaxShardSize,
    MinAgeS,
    PartBytes,
    PartSize,
    Sha256,
    SmokeBatches,
    SmokeWorkers,
    Source,
    Staging,
    Versioned,
)
from h5forge.deployments.server import app as server_app
from h5forge.messages import describe_os_error
from h5forge.options import OptionError
from h5forge.publish.history import DEFAULT_KEEP_VERSIONS, DEFAULT_MIN_AGE_S
from h5forge.text import printable

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["DEFAULT_DEMO_DEST", "app", "build", "demo", "main"]

DEFAULT_DEMO_DEST = Path("h5forge-demo") / "demo.h5"


def _pipeline(command: str) -> None:
    """Exit 2 naming the extra when the pipeline's dependencies are not installed."""
    from h5forge.errors import MissingExtraError
    from h5forge.extras import require

    try:
        require("prefect", feature=f"h5forge {command}")
    except MissingExtraError as e:
        raise usage_error(e) from e


def _config_error(e: ValidationError) -> typer.Exit:
    """Exit 2 with every problem of a BuildConfig, each in the words of its validator."""
    lines = []
    for err in e.errors():
        cause = (err.get("ctx") or {}).get("error")
        if len(e.errors()) == 1 and (
            isinstance(cause, OptionError)
            or (isinstance(cause, ValueError) and err["loc"] in ((), ("source",)))
        ):
            return usage_error(cause)  # the same line as `pack` gives for this value
        where = ".".join(str(p) for p in err["loc"]) or "config"
        lines.append(f"{where}: {cause if isinstance(cause, Exception) else err['msg']}")
    return fail("invalid options: " + "; ".join(lines), EXIT_USAGE)


def _print_summary(summary: Any) -> None:
    dest = summary.destination
    where = dest if "://" in dest else str(Path(dest).resolve())
    typer.echo(f"asset:       {printable(where)}")
    typer.echo(
        f"samples:     {summary.num_samples} in {summary.num_classes} classes, "
        f"{summary.num_quarantined} quarantined"
    )
    for split, per_class in sorted(summary.counts.items()):
        typer.echo(
            f"  {printable(split) or '(all)'}: "
            + ", ".join(f"{printable(c)} {n}" for c, n in per_class.items())
        )
    if summary.version:
        unchanged = (
            " (unchanged: source and settings are the latest's)" if summary.unchanged else ""
        )
        typer.echo(f"version:     {summary.version}{unchanged}")
    typer.echo(f"sha256:      {summary.sha256}")
    typer.echo(f"size:        {summary.bytes:,} bytes")
    if summary.shards:  # a sharded version: its manifest is its record
        typer.echo(
            f"shards:      {summary.shards} ({summary.shards_new} new, "
            f"{summary.shards_reused} reused from the previous version)"
        )
        typer.echo(f"manifest:    {printable(summary.sidecar_url)}")
    else:
        typer.echo(f"sidecar:     {printable(summary.sidecar_url)}")
    typer.echo(f"preview:     {printable(summary.preview_url)}")
    rates = ", ".join(f"{m} {r:,.0f} img/s" for m, r in summary.smoke_per_method.items())
    typer.echo(f"smoke-load:  {rates} (DataLoader workers, after start-up)")
    typer.echo("stages:      " + ", ".join(f"{k} {v:.1f}s" for k, v in summary.seconds.items()))
    if summary.parts is not None:
        parts = summary.parts
        typer.echo(
            f"parts:       {parts.total} on {parts.address}: {len(parts.packed)} packed, "
            f"{len(parts.skipped)} already done in {printable(parts.staging)}"
        )


@with_pack_options
def build(
    source: Source,
    dest: Dest,
    sha256: Sha256 = None,
    credentials_block: CredentialsBlock = None,
    smoke_workers: SmokeWorkers = 2,
    smoke_batches: SmokeBatches = 4,
    executor: ExecutorChoice = Executor.local,
    dask_address: DaskAddress = None,
    part_size: PartSize = 2000,
    part_bytes: PartBytes = None,
    staging: Staging = None,
    cache_dir: CacheDir = None,
    versioned: Versioned = False,
    keep_versions: KeepVersions = DEFAULT_KEEP_VERSIONS,
    min_age_s: MinAgeS = DEFAULT_MIN_AGE_S,
    max_shard_size: MaxShardSize = None,
    debug: Debug = False,
    pack_options: dict[str, Any] | None = None,
) -> None:
    """Run the build-h5-dataset flow: fetch, pack, verify, smoke-load and publish."""
    _pipeline("build")
    # flows.config, not flows.build: validating must not import Prefect (seconds).
    from pydantic import ValidationError

    from h5forge.deployments.local_run import run_build
    from h5forge.deployments.settings import cache_dir_from_env
    from h5forge.flows.config import DEFAULT_CACHE_DIR, BuildConfig

    if max_shard_size is not None and not versioned:
        raise usage_error(
            ValueError(
                f"--max-shard-size {max_shard_size} shards a version, and the build is not "
                "versioned (an unversioned DEST is one file): add --versioned, or drop "
                "--max-shard-size"
            )
        )
    # The checks `pack` makes too, in the same order, with the same messages, before Prefect.
    v = dict(check_options(pack_options or {}).values)
    hw = v.pop("size")
    sized = {} if hw is None else {"size": hw[0], "width": hw[1] if hw[1] != hw[0] else None}
    try:
        config = BuildConfig.model_validate(
            {
                **v,
                **sized,
                "source": source,
                "destination": dest,
                "sha256": sha256,
                "credentials_block": credentials_block,
                "smoke_workers": smoke_workers,
                "smoke_batches": smoke_batches,
                "executor": executor.value,
                "dask_address": dask_address,
                "part_size": part_size,
                "part_bytes": part_bytes,
                "staging": staging,
                "versioned": versioned,
                "keep_versions": keep_versions,
                "min_age_s": min_age_s,
                # Not given: BuildConfig's default (versioned builds are sharded).
                **({} if max_shard_size is None else {"max_shard_size": max_shard_size}),
            }
        )
    except ValidationError as e:
        raise _config_error(e) from e
    check_paths(config.source, config.destination, replace=config.overwrite or versioned)
    try:  # the folder run_build gives the flow, which checks it too (for Python and the UI)
        config.check_cache(str(cache_dir or cache_dir_from_env(os.environ) or DEFAULT_CACHE_DIR))
    except ValueError as e:
        raise usage_error(e) from e
    if config.executor == "local":  # the flow's pack runs here: its pool's fork server loads
        start_workers_early(config.source, config.workers)  # beside Prefect and its server
    _print_summary(run_build(config, cache_dir, debug))


def demo(
    dest: DemoDest = DEFAULT_DEMO_DEST,
    cache_dir: CacheDir = None,
    debug: Debug = False,
) -> None:
    """Generate the built-in demo dataset and run the whole build flow on it, offline."""
    _pipeline("demo")
    from h5forge.demo import make_demo_archive
    from h5forge.deployments.local_run import run_build
    from h5forge.flows.config import BuildConfig
    from h5forge.location import Location
    from h5forge.preflight import check_destination

    if dest.suffix != ".h5":
        raise fail(f"DEST {dest} must end in .h5", EXIT_USAGE)
    try:  # before writing the demo source beside it
        check_destination(Location(str(dest)), overwrite=True)
    except (OSError, ValueError) as e:
        raise usage_error(e) from e
    source_dir = dest.resolve().parent / f"{dest.stem}-source"
    try:
        archive = make_demo_archive(source_dir)
    except OSError as e:
        raise fail(describe_os_error(e, path=str(source_dir)), EXIT_FAILURE) from e
    typer.echo(f"demo source: {printable(archive)}")
    config = BuildConfig(
        source=str(archive),
        sha256=Location.of(archive).sha256(),
        destination=str(dest.resolve()),
        overwrite=True,
    )
    _print_summary(run_build(config, cache_dir, debug))


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help=library_app.info.help,
)
app.callback()(program_version)  # `h5forge --version`
app.command()(build)
app.command()(demo)
# pack, verify, inspect, versions and diff become commands of this app, as they are (not
# add_typer: the library app's own callback, its --version, would not carry over).
app.registered_commands.extend(library_app.registered_commands)
app.add_typer(server_app, name="server")  # h5forge server start|status|stop


def main() -> None:
    """Console entry point (``h5forge``)."""
    app()


if __name__ == "__main__":
    main()

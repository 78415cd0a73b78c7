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
Every argument is checked before Prefect is imported, so a usage error costs well under a
second, not the ~18 s of starting Prefect.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from h5forge.cli.app import app as library_app
from h5forge.cli.app import program_version
from h5forge.cli.exits import EXIT_FAILURE, EXIT_USAGE, fail, usage_error
from h5forge.cli.inputs import check_options, check_paths
from h5forge.cli.options import with_pack_options
from h5forge.messages import describe_os_error
from h5forge.options import OptionError
from h5forge.publish.history import DEFAULT_KEEP_VERSIONS, DEFAULT_MIN_AGE_S
from h5forge.text import printable

if TYPE_CHECKING:
    from pydantic import ValidationError

__all__ = ["DEFAULT_DEMO_DEST", "app", "build", "demo", "main"]

DEFAULT_DEMO_DEST = Path("h5forge-demo") / "demo.h5"


class Executor(str, Enum):
    """Where ``build`` packs: this machine's process pool, or shards on a Dask cluster."""

    local = "local"
    dask = "dask"


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
    typer.echo(f"manifest:    {printable(summary.manifest_url)}")
    typer.echo(f"preview:     {printable(summary.preview_url)}")
    rates = ", ".join(f"{m} {r:,.0f} img/s" for m, r in summary.smoke_per_method.items())
    typer.echo(f"smoke-load:  {rates} (DataLoader workers, after start-up)")
    typer.echo("stages:      " + ", ".join(f"{k} {v:.1f}s" for k, v in summary.seconds.items()))
    if summary.shards is not None:
        shards = summary.shards
        typer.echo(
            f"shards:      {shards.total} on {shards.address}: {len(shards.packed)} packed, "
            f"{len(shards.skipped)} already done in {printable(shards.staging)}"
        )


@with_pack_options
def build(
    source: Annotated[
        str,
        typer.Argument(
            help="the images: a local folder (class folders, [split/]class/image.jpg) or "
            "archive (.tar.gz, .zip ...), or a URL fsspec reads, e.g. "
            "https://host/data.tar.gz or s3://bucket/prefix/",
            show_default=False,
        ),
    ],
    dest: Annotated[
        str,
        typer.Argument(
            help="where to publish the asset: a path or URL ending in .h5, e.g. "
            "out/flowers.h5 or s3://bucket/flowers.h5; DEST.manifest.json and "
            "DEST.preview.png go beside it (with --versioned, see there)",
            show_default=False,
        ),
    ],
    sha256: Annotated[
        str | None,
        typer.Option(
            help="the sha256 (64 hex digits) the source archive must have; a download that "
            "differs fails, and a pinned archive is fetched once and cached "
            "(default: not checked)",
        ),
    ] = None,
    credentials_block: Annotated[
        str | None,
        typer.Option(
            help="name of a Prefect Secret block whose value is JSON fsspec storage_options "
            '(e.g. {"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}) for '
            "SOURCE and DEST (default: none, the environment's own credentials)",
        ),
    ] = None,
    smoke_workers: Annotated[
        int,
        typer.Option(
            help="DataLoader worker processes of the smoke-load, which reads the new asset "
            "back as training will (0: read in this process)",
        ),
    ] = 2,
    smoke_batches: Annotated[
        int, typer.Option(help="batches the smoke-load reads per start method (fork, spawn)")
    ] = 4,
    executor: Annotated[
        Executor,
        typer.Option(
            help="where the images are packed: local, a process pool on this machine; dask, "
            "shards packed on a Dask cluster (--dask-address), merged here",
        ),
    ] = Executor.local,
    dask_address: Annotated[
        str | None,
        typer.Option(
            help="with --executor dask: the scheduler's address, e.g. tcp://scheduler:8786 "
            "(what `dask scheduler` prints); default: none, required with dask",
        ),
    ] = None,
    shard_size: Annotated[
        int, typer.Option(help="with --executor dask: images per shard (one task on a worker)")
    ] = 2000,
    shard_bytes: Annotated[
        int | None,
        typer.Option(
            help="with --executor dask: also close a shard once its source files reach this "
            "many bytes, e.g. 67108864 (64 MiB) (default: no byte limit)",
        ),
    ] = None,
    staging: Annotated[
        str | None,
        typer.Option(
            help="with --executor dask: the folder every worker reaches (a shared path or a "
            "bucket URL) where shards are written (default: a folder in the fetch cache, "
            "which only workers on this machine reach)",
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="where fetched sources are kept between builds (default: "
            "$XDG_CACHE_HOME/h5forge, else ~/.cache/h5forge)",
        ),
    ] = None,
    versioned: Annotated[
        bool,
        typer.Option(
            help="publish a new immutable version BASE/v/<sha>/NAME.h5 of the asset DEST "
            "names (BASE is DEST without .h5) and move BASE.latest.json to it; nothing when "
            "source and settings are unchanged; incremental otherwise. Read it back as DEST "
            "or BASE (verify, inspect, H5ImageDataset), with --version to pick one",
        ),
    ] = False,
    keep_versions: Annotated[
        int,
        typer.Option(
            help="with --versioned: versions kept (>= 1); older ones are deleted once they "
            "are also older than --min-age-s",
        ),
    ] = DEFAULT_KEEP_VERSIONS,
    min_age_s: Annotated[
        float,
        typer.Option(
            help="with --versioned: seconds a version is kept at least, whatever "
            "--keep-versions says (86400 = one day), so readers that pinned it can finish",
        ),
    ] = DEFAULT_MIN_AGE_S,
    debug: Annotated[
        bool,
        typer.Option(help="on an unexpected error, show its Python traceback, not one line"),
    ] = False,
    pack_options: dict[str, Any] | None = None,
) -> None:
    """Run the build-h5-dataset flow: fetch, pack, verify, smoke-load and publish."""
    _pipeline("build")
    # flows.config, not flows.build: validating must not import Prefect (seconds).
    from pydantic import ValidationError

    from h5forge.deployments.local_run import run_build
    from h5forge.flows.config import BuildConfig

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
                "shard_size": shard_size,
                "shard_bytes": shard_bytes,
                "staging": staging,
                "versioned": versioned,
                "keep_versions": keep_versions,
                "min_age_s": min_age_s,
            }
        )
    except ValidationError as e:
        raise _config_error(e) from e
    check_paths(config.source, config.destination, replace=config.overwrite or versioned)
    _print_summary(run_build(config, cache_dir, debug))


def demo(
    dest: Annotated[
        Path,
        typer.Argument(
            help="where to publish the demo asset (.h5); the generated source archive goes "
            "beside it, in NAME-source/",
        ),
    ] = DEFAULT_DEMO_DEST,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            help="where fetched sources are kept between builds (default: "
            "$XDG_CACHE_HOME/h5forge, else ~/.cache/h5forge)",
        ),
    ] = None,
    debug: Annotated[
        bool,
        typer.Option(help="on an unexpected error, show its Python traceback, not one line"),
    ] = False,
) -> None:
    """Generate the built-in demo dataset and run the whole build flow on it, offline."""
    _pipeline("demo")
    from h5forge.demo import make_demo_archive
    from h5forge.deployments.local_run import run_build
    from h5forge.flows.config import BuildConfig
    from h5forge.hashing import sha256_file
    from h5forge.preflight import check_destination

    if dest.suffix != ".h5":
        raise fail(f"DEST {dest} must end in .h5", EXIT_USAGE)
    try:  # before writing the demo source beside it
        check_destination(str(dest), overwrite=True)
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
        sha256=sha256_file(archive),
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


def main() -> None:
    """Console entry point (``h5forge``)."""
    app()


if __name__ == "__main__":
    main()

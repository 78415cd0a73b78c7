"""The ``h5forge`` console script: the library's commands plus ``build`` and ``demo`` (Prefect).

``build`` and ``demo`` run the ``build-h5-dataset`` flow in this process. With no
``PREFECT_API_URL`` set, Prefect starts a temporary local server for the run and stops it at the
end, so both work offline on a fresh machine.

Exit codes (the table of :mod:`h5forge.cli`): 0 success; 1 the build or an integrity check
failed; 2 usage error (bad option, a local source that is not there, a destination that exists
without ``--overwrite``, is read-only, full or inside the source, unknown credentials block).
Every argument is checked before Prefect is imported, so a usage error costs well under a
second, not the ~18 s of starting Prefect.
"""

from __future__ import annotations

import logging
import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from flows.temporary_server import STARTUP_SETTING, ServerStartError, start_temporary_server
from h5forge.cli import app
from h5forge.cli_exits import EXIT_FAILURE, EXIT_USAGE, fail, usage_error
from h5forge.cli_options import check_pack_options, with_pack_options
from h5forge.errors import DestinationExistsError, H5ForgeError, PreviewPublishError
from h5forge.messages import describe_os_error, os_error_in
from h5forge.options import OptionError
from h5forge.redact import redact_text
from h5forge.text import printable

__all__ = ["app", "main"]

DEFAULT_DEMO_DEST = Path("h5forge-demo") / "demo.h5"

# How long build and demo wait for their temporary Prefect server unless STARTUP_SETTING is
# set: a first start (it creates its SQLite database) took over 20 s, Prefect's default, on a
# 2-core machine with a load of ~3.
EPHEMERAL_STARTUP_TIMEOUT_S = 180.0


class Executor(str, Enum):
    """Where ``build`` packs: this machine's process pool, or shards on a Dask cluster."""

    local = "local"
    dask = "dask"


class _NoTraceback(logging.Formatter):
    """Console formatter that leaves tracebacks out (the API log handler still records them)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self._inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            # A copy, so the handlers that run after this one still see the traceback.
            record = logging.makeLogRecord(
                {**record.__dict__, "exc_info": None, "exc_text": None, "stack_info": None}
            )
        return self._inner.format(record)


def _quiet_console_tracebacks() -> None:
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [
        logging.getLogger(),
        *(
            logging.getLogger(name)
            for name in list(logging.root.manager.loggerDict)
            if name.startswith("prefect")
        ),
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler) and not isinstance(
                handler.formatter, _NoTraceback
            ):
                handler.setFormatter(_NoTraceback(handler.formatter))


def _config_error(e: ValidationError) -> typer.Exit:
    """Exit 2 with every problem of a BuildConfig, each in the words of its validator."""
    lines = []
    for err in e.errors():
        cause = (err.get("ctx") or {}).get("error")
        if len(e.errors()) == 1 and (
            isinstance(cause, OptionError) or (isinstance(cause, ValueError) and not err["loc"])
        ):
            return usage_error(cause)  # the same line as `pack` gives for this value
        where = ".".join(str(p) for p in err["loc"]) or "config"
        lines.append(f"{where}: {cause if isinstance(cause, Exception) else err['msg']}")
    return fail("invalid options: " + "; ".join(lines), EXIT_USAGE)


def _startup_bound() -> float:
    """Seconds to wait for the temporary server: the user's setting, else our default."""
    raw = os.environ.get(STARTUP_SETTING)
    if raw is None:
        return EPHEMERAL_STARTUP_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise fail(
            f"{STARTUP_SETTING}={printable(raw)} is not a number of seconds", EXIT_USAGE
        ) from None


def _run_build(config: Any, cache_dir: Path | None, debug: bool) -> Any:
    """Run the flow; map failures to an exit code and one paragraph (no traceback).

    With no ``PREFECT_API_URL`` the run gets its own temporary server (see
    :mod:`flows.temporary_server`), started before Prefect is imported so that Prefect's
    settings see its URL.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if os.environ.get("PREFECT_API_URL"):
        return _run_flow(config, cache_dir, debug)
    try:
        start_temporary_server(_startup_bound(), lambda line: typer.echo(line, err=True))
    except ServerStartError as e:
        raise fail(str(e), EXIT_FAILURE) from e
    return _run_flow(config, cache_dir, debug)


def _run_flow(config: Any, cache_dir: Path | None, debug: bool) -> Any:
    from flows.build import build_dataset

    if not debug:
        _quiet_console_tracebacks()
    try:
        return build_dataset(config, cache_dir=str(cache_dir) if cache_dir else None)
    except DestinationExistsError as e:
        raise usage_error(e) from e
    except PreviewPublishError as e:  # the asset is there: say so, not "nothing was published"
        raise fail(f"build failed after publishing: {redact_text(str(e))}", EXIT_FAILURE) from e
    except (FileExistsError, FileNotFoundError, ValidationError) as e:
        raise usage_error(_redacted(e)) from e
    except OSError as e:
        raise fail(
            f"build failed, nothing was published: "
            f"{redact_text(describe_os_error(e, overwrite_flag='--overwrite'))}",
            EXIT_FAILURE,
        ) from e
    except H5ForgeError as e:
        cause = os_error_in(e)
        text = describe_os_error(cause) if cause is not None else str(e)
        raise fail(f"build failed, nothing was published: {redact_text(text)}", EXIT_FAILURE) from e
    except ValueError as e:
        raise fail(redact_text(str(e)), EXIT_USAGE) from e
    except Exception as e:  # noqa: BLE001 - the CLI's job: one paragraph instead of a traceback
        if debug:
            raise
        cause = os_error_in(e)
        text = (
            describe_os_error(cause)
            if cause is not None
            else (f"{type(e).__name__}: {redact_text(str(e))}")
        )
        raise fail(
            f"build failed, nothing was published: {text} (run with --debug for the traceback)",
            EXIT_FAILURE,
        ) from e


def _redacted(e: BaseException) -> BaseException:
    """``e`` with its message redacted, for a usage line (same type, errno kept)."""
    text = describe_os_error(e) if isinstance(e, OSError) else str(e)
    new = type(e)(redact_text(text)) if isinstance(e, OSError) else ValueError(redact_text(text))
    return new


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


def _check_paths(config: Any) -> None:
    """Before Prefect: a local source exists; a local destination can take the asset."""
    from h5forge.preflight import check_destination, check_source, local_path

    try:
        check_source(config.source)
        if local_path(config.destination) is not None:  # remote: the flow checks, with keys
            check_destination(config.destination, source=config.source, overwrite=config.overwrite)
    except (OSError, ValueError) as e:
        raise usage_error(e) from e


@app.command()
@with_pack_options
def build(
    source: Annotated[str, typer.Argument(help="local folder/archive or fsspec URL of images")],
    dest: Annotated[str, typer.Argument(help="where to publish the .h5 (path or fsspec URL)")],
    sha256: Annotated[str | None, typer.Option(help="sha256 of the source archive")] = None,
    credentials_block: Annotated[
        str | None, typer.Option(help="Prefect Secret block holding fsspec storage_options as JSON")
    ] = None,
    smoke_workers: Annotated[int, typer.Option(help="DataLoader workers in the smoke-load")] = 2,
    smoke_batches: Annotated[int, typer.Option(help="batches per start method")] = 4,
    executor: Annotated[
        Executor,
        typer.Option(help="local: process pool here; dask: shards on a Dask cluster, merged here"),
    ] = Executor.local,
    dask_address: Annotated[
        str | None, typer.Option(help="executor dask: scheduler address, tcp://HOST:8786")
    ] = None,
    shard_size: Annotated[int, typer.Option(help="executor dask: images per shard")] = 2000,
    shard_bytes: Annotated[
        int | None, typer.Option(help="executor dask: also close a shard at this many source bytes")
    ] = None,
    staging: Annotated[
        str | None,
        typer.Option(
            help="executor dask: shard folder every worker reaches (shared path or bucket); "
            "default a folder in the cache"
        ),
    ] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="fetch cache (default ~/.cache/h5forge)")
    ] = None,
    debug: Annotated[bool, typer.Option(help="show tracebacks")] = False,
    pack_options: dict[str, Any] | None = None,
) -> None:
    """Run the build-h5-dataset flow: fetch, pack, verify, smoke-load and publish."""
    # flows.config, not flows.build: validating must not import Prefect (seconds).
    from flows.config import BuildConfig

    v = check_pack_options(pack_options or {})
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
            }
        )
    except ValidationError as e:
        raise _config_error(e) from e
    _check_paths(config)
    _print_summary(_run_build(config, cache_dir, debug))


@app.command()
def demo(
    dest: Annotated[Path, typer.Argument(help="where to publish the demo .h5")] = DEFAULT_DEMO_DEST,
    cache_dir: Annotated[
        Path | None, typer.Option(help="fetch cache (default ~/.cache/h5forge)")
    ] = None,
    debug: Annotated[bool, typer.Option(help="show tracebacks")] = False,
) -> None:
    """Generate the built-in demo dataset and run the whole build flow on it, offline."""
    from flows.config import BuildConfig
    from h5forge.demo import make_demo_archive
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
    _print_summary(_run_build(config, cache_dir, debug))


def main() -> None:
    """Console entry point (``h5forge``)."""
    app()


if __name__ == "__main__":
    main()

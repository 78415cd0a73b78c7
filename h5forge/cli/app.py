"""``h5forge`` command line: pack, verify, inspect, versions, diff, compact and purge, without
Prefect.

Exit codes, the same for every command (``build`` and ``demo`` included): 0 success, 1
integrity or run failure, 2 usage error; the table is in :mod:`h5forge.cli.exits`.

The pack options come from :mod:`h5forge.options` (one name, type, default, bounds and help
each), shared with ``build`` and the build form through :mod:`h5forge.cli.options`. The Prefect
commands (``build``, ``demo``) live in the console script, :mod:`h5forge.deployments.cli`,
which adds this app's commands to its own.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from h5forge.cli.exits import EXIT_FAILURE, EXIT_USAGE, fail, run_guarded
from h5forge.cli.options import AssetName, AssetVersion, with_pack_options
from h5forge.cli.shards import compact, purge
from h5forge.cli.summary import format_summary
from h5forge.cli.verify import verify
from h5forge.text import printable

__all__ = ["app", "main", "program_version"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Turn image folders into verified HDF5 assets, and check them.",
)


def _print_version(given: bool) -> None:
    if given:
        from h5forge import __version__

        typer.echo(f"h5forge {__version__}")
        raise typer.Exit()


def program_version(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="print h5forge's version and exit (a command's own --version picks an "
            "asset's version)",
        ),
    ] = False,
) -> None:
    """Turn image folders into verified HDF5 assets, and check them."""


app.callback()(program_version)


@app.command()
@with_pack_options
def pack(
    src: Annotated[
        str,
        typer.Argument(
            help="the local image folder to pack: class folders (ImageFolder: "
            "class/image.jpg or split/class/image.jpg), or the folder a --listing or --coco "
            "file refers to",
            show_default=False,
        ),
    ],
    out: Annotated[
        str,
        typer.Argument(
            help="the local .h5 file to write (written as OUT.partial, renamed when sealed)",
            show_default=False,
        ),
    ],
    pack_options: dict[str, Any],
) -> None:
    """Pack an image folder into a sealed HDF5 file (no Prefect)."""
    from h5forge.cli.inputs import check_options, check_paths, start_workers_early
    from h5forge.preflight import local_path

    # The checks `build` makes too, in the same order, with the same messages.
    checked = check_options(pack_options)
    check_paths(src, out, replace=checked.values["overwrite"], local_only=True)
    start_workers_early(src, checked.values.get("workers"))  # beside the packer's imports
    from h5forge.pack.writer import pack as do_pack  # h5py, Pillow: after the checks

    result = run_guarded(
        do_pack,
        str(local_path(src)),
        str(local_path(out)),
        what=out,
        config=checked.config,
        progress=True,
        **checked.rest,
    )
    typer.echo(
        f"wrote {printable(result.path)}: {result.num_samples} samples, "
        f"{result.num_classes} classes, {result.num_quarantined} quarantined, "
        f"{result.bytes:,} bytes, "
        f"{result.num_samples / max(result.seconds, 1e-9):.0f} img/s"
    )
    for path, reason in result.quarantined[:20]:
        typer.echo(f"  quarantined {printable(path)}: {printable(reason)}")


app.command()(verify)


@app.command()
def inspect(
    file: AssetName,
    version: AssetVersion = None,
    preview: Annotated[
        Path | None,
        typer.Option(
            help="also write a labelled grid of the first --n images to this PNG file "
            "(default: no preview)"
        ),
    ] = None,
    n: Annotated[int, typer.Option(min=1, max=256, help="images in the preview grid")] = 16,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the summary as one JSON document")
    ] = False,
) -> None:
    """Print a summary of the file (counts, layout, size, config); optionally a preview grid."""
    from h5forge.location import Location
    from h5forge.read.sharded import is_manifest
    from h5forge.read.version import resolve_asset
    from h5forge.summary import summarize, summarize_sharded

    asset = run_guarded(Location, file, what=file)
    file, sha = run_guarded(resolve_asset, asset, version, what=file)
    where = asset.with_url(file)
    if is_manifest(file):  # a sharded version: its manifest and shards
        info = {**run_guarded(summarize_sharded, where, sha, what=file), "version": sha}
    else:
        info = {**run_guarded(summarize, where, what=file), "version": sha}
    if as_json:
        # ASCII: names from the file reach the terminal as \u escapes, never as controls.
        typer.echo(json.dumps(info, indent=2, ensure_ascii=True))
    else:
        if sha:
            typer.echo(f"version:   {sha}")
        typer.echo(format_summary(info))
    if preview is not None:
        from h5forge.publish.preview import write_preview

        shown = where.with_url(info["first_shard"]) if info.get("first_shard") else where
        run_guarded(write_preview, shown, preview, what=str(preview), n=n)
        typer.echo(f"preview written to {printable(preview)}")


@app.command()
def versions(
    url: Annotated[
        str,
        typer.Argument(
            help="the asset: the name it was built to, DEST.h5, or its base DEST (a path or "
            "fsspec URL, e.g. out/flowers.h5 or s3://bucket/flowers)",
            show_default=False,
        ),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="print the versions as one JSON document")
    ] = False,
) -> None:
    """List the published versions of an asset, oldest first (single-file and sharded, with
    their shards); exit 1 when it has none."""
    from h5forge.location import Location
    from h5forge.publish.history import scan_versions

    scan = run_guarded(scan_versions, run_guarded(Location, url, what=url), what=url)
    if as_json:
        rows = [dataclasses.asdict(v) for v in scan.versions]
        typer.echo(json.dumps({"versions": rows, "skipped": scan.skipped}, indent=2))
    if not scan.versions:
        raise fail(
            f"{printable(url)} has no published versions (nothing under its v/ folder"
            + (f"; {scan.skipped} entries there are not h5forge versions" if scan.skipped else "")
            + "); publish one with h5forge.publish.release.publish_version",
            EXIT_FAILURE,
        )
    if as_json:
        return
    for v in scan.versions:
        samples = "" if v.num_samples is None else f"{v.num_samples} samples  "
        mark = "latest  " if v.latest else ""
        parent = v.parent[:16] if v.parent else "-"
        size = f"{v.bytes:,} bytes" + (f" in {v.shards} shards" if v.kind == "sharded" else "")
        typer.echo(f"{v.version}  {v.created_at}  {size}  {samples}{mark}parent {parent}")
    if scan.skipped:
        typer.echo(f"({scan.skipped} entries under v/ skipped: not versions h5forge wrote)")


@app.command()
def diff(
    refs: Annotated[
        list[str],
        typer.Argument(
            help="A B: two .h5 files (paths or fsspec URLs); or BASE V1 V2: an asset (DEST.h5 "
            "or its base) and two of its versions, each latest or a sha256 prefix of 16-64 "
            "hex digits (see `h5forge versions`)",
            show_default=False,
        ),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="print the difference as one JSON document")
    ] = False,
) -> None:
    """Say what changed between two files or versions, from their indexes (no sample bytes)."""
    from h5forge.location import Location
    from h5forge.publish.diff import diff_files, resolve_pair

    if len(refs) not in (2, 3):
        raise fail(f"diff takes A B or BASE V1 V2, not {len(refs)} arguments", EXIT_USAGE)
    first = run_guarded(Location, refs[0], what=refs[0])
    a, b = run_guarded(resolve_pair, first, refs[1:], what=refs[0])
    d = run_guarded(diff_files, a, b, what=a.url)
    if as_json:
        typer.echo(json.dumps(dataclasses.asdict(d), indent=2, ensure_ascii=True))
        return
    classes = [f"+{c}" for c in d.classes_added] + [f"-{c}" for c in d.classes_removed]
    for line in (
        f"{printable(d.a)} -> {printable(d.b)}",
        f"samples: {d.samples[0]} -> {d.samples[1]} ({d.added} added, {d.removed} removed, "
        f"{d.replaced} replaced, {d.same} unchanged)",
        f"classes: {printable(' '.join(classes)) if classes else 'unchanged'}",
        f"config: {'changed' if d.config_changed else 'unchanged'}",
    ):
        typer.echo(line)


app.command()(compact)
app.command()(purge)


def main() -> None:
    """Console entry point of the library-only CLI."""
    app()

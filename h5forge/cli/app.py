"""``h5forge`` command line: pack, verify, inspect, versions and diff, without Prefect.

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
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from h5forge.cli.exits import EXIT_FAILURE, EXIT_USAGE, fail, run_guarded
from h5forge.cli.options import with_pack_options
from h5forge.cli.summary import format_summary
from h5forge.errors import IntegrityError
from h5forge.text import printable

__all__ = ["app", "main"]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Turn image folders into verified HDF5 assets, and check them.",
)


@app.command()
@with_pack_options
def pack(
    src: Annotated[
        str,
        typer.Argument(
            help="the local image folder to pack: class folders (ImageFolder: "
            "[split/]class/image.jpg), or the folder a --manifest or --coco file refers to",
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
    from h5forge.cli.inputs import check_options, check_paths
    from h5forge.preflight import local_path

    # The checks `build` makes too, in the same order, with the same messages.
    checked = check_options(pack_options)
    check_paths(src, out, replace=checked.values["overwrite"], local_only=True)
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


def _verify_with_manifest(
    file: str, manifest_url: str | None, verify_file: Callable[[], Any]
) -> tuple[Any, str | None]:
    """Verify ``file`` with ``verify_file()``; then compare it with its manifest (the sidecar,
    or ``manifest_url``).

    Returns the report and the manifest URL checked (None when there is none beside the file).
    A manifest that changed while the file was verified (a republish) is checked again.
    """
    from h5forge.publish.manifest import check_verified, read_manifest
    from h5forge.publish.manifest import manifest_url as sidecar
    from h5forge.summary import summarize

    target = manifest_url or sidecar(file)

    def load() -> dict[str, Any] | None:
        try:
            return read_manifest(target)
        except FileNotFoundError:
            if manifest_url is not None:  # named on the command line: it must be there
                raise
            return None
        except ValueError as e:  # a manifest that is not one is a failed check, not usage
            raise IntegrityError(str(e)) from e

    manifest = run_guarded(load)
    for _ in range(3):
        report = verify_file()
        latest = run_guarded(load)
        if latest == manifest:
            break
        manifest = latest
    if manifest is None:
        return report, None
    counts = run_guarded(summarize, file)["counts"] if "counts" in manifest else None
    run_guarded(check_verified, file, manifest, report, counts=counts)
    return report, target


@app.command()
def verify(
    file: Annotated[str, typer.Argument(help="path or fsspec URL of the .h5 file")],
    sample_fraction: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    manifest: Annotated[
        str | None,
        typer.Option(
            help="the manifest to compare with (default: FILE.manifest.json when it exists)"
        ),
    ] = None,
    no_manifest: Annotated[
        bool, typer.Option("--no-manifest", help="do not compare with a manifest")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Verify structure, labels, byte ranges, digests, and the manifest; exit 1 on any failure.

    When FILE.manifest.json is beside FILE (or --manifest names one), its sha256, size, counts
    and format version must agree with the file.
    """
    if no_manifest and manifest is not None:
        raise fail("--manifest and --no-manifest contradict each other; give one", EXIT_USAGE)
    from h5forge.verify.checks import verify as do_verify

    def verify_file() -> Any:
        return run_guarded(
            do_verify,
            file,
            what=file,
            sample_fraction=sample_fraction,
            seed=seed,
            progress=not as_json,
        )

    if no_manifest:
        report, checked = verify_file(), None
    else:
        report, checked = _verify_with_manifest(file, manifest, verify_file)
    if as_json:
        typer.echo(json.dumps({**report.__dict__, "manifest": checked}, indent=2))
        return
    against = (
        f"; matches its manifest {printable(checked)}"
        if checked
        else "; no manifest checked" + ("" if no_manifest else " (none beside it)")
    )
    typer.echo(
        f"OK {printable(report.path)}: {report.num_samples} samples, "
        f"{report.num_classes} classes, {report.bytes:,} bytes, sha256 {report.sha256}, "
        f"{report.checked_samples} digests checked in {report.seconds:.2f} s{against}"
    )


@app.command()
def inspect(
    file: Annotated[str, typer.Argument(help="path or fsspec URL of the .h5 file")],
    preview: Annotated[Path | None, typer.Option(help="write a labelled grid PNG here")] = None,
    n: Annotated[int, typer.Option(min=1, max=256, help="images in the preview")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Print a summary of the file (counts, layout, size, config); optionally a preview grid."""
    from h5forge.summary import summarize

    info = run_guarded(summarize, file, what=file)
    if as_json:
        # ASCII: names from the file reach the terminal as \u escapes, never as controls.
        typer.echo(json.dumps(info, indent=2, ensure_ascii=True))
    else:
        typer.echo(format_summary(info))
    if preview is not None:
        from h5forge.publish.preview import write_preview

        run_guarded(write_preview, file, preview, what=str(preview), n=n)
        typer.echo(f"preview written to {printable(preview)}")


@app.command()
def versions(
    url: Annotated[str, typer.Argument(help="the asset: BASE or BASE.h5 (path or fsspec URL)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the versions as JSON")] = False,
) -> None:
    """List the published versions of an asset, oldest first; exit 1 when it has none."""
    from h5forge.publish.history import scan_versions

    scan = run_guarded(scan_versions, url, what=url)
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
        typer.echo(
            f"{v.version}  {v.created_at}  {v.bytes:,} bytes  {samples}{mark}parent {parent}"
        )
    if scan.skipped:
        typer.echo(f"({scan.skipped} entries under v/ skipped: not versions h5forge wrote)")


@app.command()
def diff(
    refs: Annotated[
        list[str],
        typer.Argument(help="A B (two .h5 URLs) or BASE V1 V2 (an asset, two versions or latest)"),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="print the difference as JSON")] = False,
) -> None:
    """Say what changed between two files or versions, from their indexes (no sample bytes)."""
    from h5forge.publish.diff import diff_files, resolve_pair

    if len(refs) not in (2, 3):
        raise fail(f"diff takes A B or BASE V1 V2, not {len(refs)} arguments", EXIT_USAGE)
    a, b = run_guarded(resolve_pair, refs, what=refs[0])
    d = run_guarded(diff_files, a, b, what=a)
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


def main() -> None:
    """Console entry point of the library-only CLI."""
    app()

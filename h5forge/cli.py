"""``h5forge`` command line: pack, verify and inspect, without Prefect.

Exit codes: 0 success, 1 integrity failure (or a pack that failed its checks), 2 usage error.
The Prefect commands (``build``, ``demo``) are added to this app by ``flows/cli.py``.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from h5forge.errors import H5ForgeError, IntegrityError, MissingExtraError, TooManyBadImagesError

__all__ = ["app", "main"]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Turn image folders into verified HDF5 assets, and check them.")

EXIT_INTEGRITY = 1
EXIT_USAGE = 2


class Layout(str, Enum):
    decoded = "decoded"
    encoded = "encoded"


class Encoding(str, Enum):
    original = "original"
    jpeg = "jpeg"
    png = "png"
    webp = "webp"


class Resize(str, Enum):
    none = "none"
    resize = "resize"
    shorter_side = "shorter-side"


class Compression(str, Enum):
    none = "none"
    gzip = "gzip"
    lzf = "lzf"
    blosc_lz4 = "blosc-lz4"
    zstd = "zstd"


def fail(message: str, code: int) -> typer.Exit:
    """Print ``message`` to stderr and return the ``typer.Exit`` to raise."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


def run_guarded(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` and turn h5forge's errors into a message and an exit code (no traceback)."""
    try:
        return fn(*args, **kwargs)
    except (IntegrityError, TooManyBadImagesError) as e:
        raise fail(str(e), EXIT_INTEGRITY) from e
    except (H5ForgeError, MissingExtraError, ValueError, FileExistsError,
            FileNotFoundError) as e:
        raise fail(str(e), EXIT_USAGE) from e


def _parse_size(size: str) -> tuple[int, int] | None:
    if size.lower() == "none":
        return None
    h, _, w = size.lower().partition("x")
    try:
        return (int(h), int(w or h))
    except ValueError:
        raise typer.BadParameter(f"size {size!r}: expected S or HxW, e.g. 224 or 224x256") from None


@app.command()
def pack(
    src: Annotated[Path, typer.Argument(help="dataset root: ImageFolder, or manifest's folder")],
    out: Annotated[Path, typer.Argument(help="the .h5 file to write")],
    manifest: Annotated[Path | None, typer.Option(help="CSV/JSONL with path,label[,split]")] = None,
    layout: Annotated[Layout, typer.Option(help="decoded pixels or encoded bytes")]
    = Layout.decoded,
    encoding: Annotated[Encoding, typer.Option(help="encoded layout only")] = Encoding.original,
    quality: Annotated[int, typer.Option(min=1, max=100, help="jpeg/webp quality")] = 90,
    resize: Annotated[Resize, typer.Option(help="resize policy")] = Resize.shorter_side,
    size: Annotated[str, typer.Option(help="output size S or HxW ('none' with --resize none)")]
    = "224",
    shorter_side: Annotated[int | None, typer.Option(help="S for shorter-side")] = None,
    mode: Annotated[str, typer.Option(help="RGB or L")] = "RGB",
    compression: Annotated[Compression, typer.Option(help="filter on decoded images")]
    = Compression.none,
    compression_level: Annotated[int | None, typer.Option(help="codec level")] = None,
    fletcher32: Annotated[bool, typer.Option(help="HDF5 checksum per chunk")] = False,
    workers: Annotated[int | None, typer.Option(min=1, help="processes (default: all)")] = None,
    max_bad_fraction: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.01,
    overwrite: Annotated[bool, typer.Option(help="replace OUT if it exists")] = False,
) -> None:
    """Pack an image folder into a sealed HDF5 file (no Prefect)."""
    from h5forge.images import ImageConfig
    from h5forge.writer import pack as do_pack

    parsed = None if resize is Resize.none and size.lower() == "none" else _parse_size(size)
    image = run_guarded(ImageConfig, layout=layout.value, encoding=encoding.value,
                        quality=quality, mode=mode, resize=resize.value, size=parsed,
                        shorter_side=shorter_side)
    result = run_guarded(do_pack, src, out, image=image, manifest=manifest,
                         compression=compression.value, compression_level=compression_level,
                         fletcher32=fletcher32, workers=workers,
                         max_bad_fraction=max_bad_fraction, overwrite=overwrite, progress=True)
    typer.echo(f"wrote {result.path}: {result.num_samples} samples, {result.num_classes} "
               f"classes, {result.num_quarantined} quarantined, {result.bytes:,} bytes, "
               f"{result.num_samples / max(result.seconds, 1e-9):.0f} img/s")
    for path, reason in result.quarantined[:20]:
        typer.echo(f"  quarantined {path}: {reason}")


@app.command()
def verify(
    file: Annotated[str, typer.Argument(help="path or fsspec URL of the .h5 file")],
    sample_fraction: Annotated[float, typer.Option(min=0.0, max=1.0)] = 1.0,
    seed: Annotated[int, typer.Option()] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Verify structure, labels, byte ranges and per-sample digests; exit 1 on any failure."""
    from h5forge.verify import verify as do_verify

    report = run_guarded(do_verify, file, sample_fraction=sample_fraction, seed=seed,
                         progress=not as_json)
    if as_json:
        typer.echo(json.dumps(report.__dict__, indent=2))
    else:
        typer.echo(f"OK {report.path}: {report.num_samples} samples, {report.num_classes} "
                   f"classes, {report.bytes:,} bytes, sha256 {report.sha256}, "
                   f"{report.checked_samples} digests checked in {report.seconds:.2f} s")


@app.command()
def inspect(
    file: Annotated[str, typer.Argument(help="path or fsspec URL of the .h5 file")],
    preview: Annotated[Path | None, typer.Option(help="write a labelled grid PNG here")] = None,
    n: Annotated[int, typer.Option(min=1, max=256, help="images in the preview")] = 16,
) -> None:
    """Print a summary of the file; optionally write a preview grid."""
    from h5forge.summary import summarize

    info = run_guarded(summarize, file)
    typer.echo(json.dumps(info, indent=2, ensure_ascii=False))
    if preview is not None:
        from h5forge.preview import write_preview

        run_guarded(write_preview, file, preview, n=n)
        typer.echo(f"preview written to {preview}")


def main() -> None:
    """Console entry point of the library-only CLI."""
    app()


if __name__ == "__main__":
    main()

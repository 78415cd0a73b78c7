"""``h5forge`` command line: pack, verify and inspect, without Prefect.

Exit codes, the same for every command (``build`` and ``demo`` included):

====  ===========================================================================
0     success
1     integrity or run failure: a file failed its checks or disagrees with its
      manifest, too many images were quarantined, the disk filled up mid-run
2     usage: a bad option or value, a source that does not exist, a destination
      that exists (without ``--overwrite``), is read-only, full, or inside the source
====  ===========================================================================

The pack options come from :mod:`h5forge.options` (one name, type, default, bounds and help
each), shared with ``build`` and the build form. The Prefect commands (``build``, ``demo``) are
added to this app by ``flows/cli.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect as pyinspect
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from h5forge.errors import (
    BusyError,
    DestinationExistsError,
    H5ForgeError,
    IntegrityError,
    MissingExtraError,
    TooManyBadImagesError,
)
from h5forge.messages import describe_os_error, os_error_in
from h5forge.options import (
    PACK_OPTIONS,
    OptionError,
    check_compression,
    format_size,
    option,
    parse_size,
)
from h5forge.text import printable

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTEGRITY",
    "EXIT_OK",
    "EXIT_USAGE",
    "app",
    "check_pack_options",
    "fail",
    "main",
    "pack_default",
    "pack_flag",
    "run_guarded",
    "usage_error",
]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Turn image folders into verified HDF5 assets, and check them.",
)

EXIT_OK = 0
EXIT_FAILURE = 1  # integrity or run failure
EXIT_INTEGRITY = EXIT_FAILURE
EXIT_USAGE = 2


_PANEL = "Pack options (the same in pack, build and the UI form)"


def pack_flag(name: str) -> Any:
    """The Typer option of the pack option ``name``: its flag and help, from h5forge.options.

    Bounds and choices are checked by :func:`check_pack_options` (not by click), so that
    ``pack``, ``build`` and the build form refuse a value with the same message.
    """
    o = option(name)
    if o.kind == "choice":
        return typer.Option(
            o.flag,
            help=o.help,
            metavar="[" + "|".join(o.choices) + "]",
            show_default=True,
            rich_help_panel=_PANEL,
        )
    if o.kind == "bool":
        return typer.Option(f"{o.flag}/--no-{o.flag[2:]}", help=o.help, rich_help_panel=_PANEL)
    if o.kind == "size":
        return typer.Option(o.flag, help=o.help, metavar="S|HxW|none", rich_help_panel=_PANEL)
    shown = f" [{o.bounds}]" if o.kind in ("int", "float") else ""
    return typer.Option(o.flag, help=o.help + shown, rich_help_panel=_PANEL)


def fail(message: str, code: int) -> typer.Exit:
    """Print ``message`` to stderr (control characters escaped) and return the Exit to raise."""
    # Line by line: a multi-line report keeps its lines; no terminal control gets through.
    # Only what is not printable is escaped here: names the message already passed through
    # printable() keep their single backslashes.
    safe = "\n".join(
        "".join(ch if ch.isprintable() else printable(ch) for ch in line)
        for line in message.splitlines() or [""]
    )
    typer.secho(f"error: {safe}", err=True, fg=typer.colors.RED)
    return typer.Exit(code)


def usage_error(e: BaseException) -> typer.Exit:
    """The exit for an error found before any work (a bad argument or path): exit 2."""
    if isinstance(e, DestinationExistsError):
        return fail(f"{e.url} already exists; pass --overwrite to replace it", EXIT_USAGE)
    if isinstance(e, OptionError):
        return fail(f"invalid value for {option(e.option).flag}: {e}", EXIT_USAGE)
    text = describe_os_error(e, overwrite_flag="--overwrite") if isinstance(e, OSError) else str(e)
    # The library words the fix for Python callers; on the command line it is a flag.
    for python in ("overwrite=True (CLI: --overwrite)", "overwrite=True"):
        text = text.replace(python, "--overwrite")
    return fail(text, EXIT_USAGE)


def run_guarded(fn: Callable[..., Any], *args: Any, what: str | None = None, **kwargs: Any) -> Any:
    """Call ``fn``; turn its errors into one message and the exit-code table's code.

    Args:
        what: the path to name in an operating-system error that carries none (the output).
    """
    try:
        return fn(*args, **kwargs)
    except (IntegrityError, TooManyBadImagesError) as e:
        raise fail(str(e), EXIT_FAILURE) from e
    except (
        DestinationExistsError,
        OptionError,
        MissingExtraError,
        BusyError,
        FileExistsError,
        FileNotFoundError,
    ) as e:
        raise usage_error(e) from e
    except OSError as e:
        raise fail(
            describe_os_error(e, path=what, overwrite_flag="--overwrite"), EXIT_FAILURE
        ) from e
    except (H5ForgeError, ValueError) as e:
        cause = os_error_in(e)  # e.g. an extraction that ran out of disk
        if cause is not None:
            raise fail(describe_os_error(cause, path=what), EXIT_FAILURE) from e
        raise fail(str(e), EXIT_USAGE) from e


def check_pack_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """Check command-line pack options with the rules of :mod:`h5forge.options`.

    ``size`` is given as text (``224``, ``224x256``, ``none``) and comes back as ``(H, W)`` or
    None; every other value comes back as given. Exits 2 with the option's message.
    """
    checked = dict(values)
    try:
        for name, value in values.items():
            if name == "size":
                checked[name] = parse_size(value, values.get("resize"))
            else:
                option(name).check(value)
        if "compression" in values:
            fixed = (
                values.get("layout", "decoded") == "decoded"
                and values.get("resize", "shorter-side") != "none"
            )
            check_compression(
                values["compression"], values.get("compression_level"), fixed_size_decoded=fixed
            )
    except OptionError as e:
        raise usage_error(e) from e
    return checked


def pack_default(name: str) -> Any:
    """The command-line default of the pack option ``name`` (``--size`` as text)."""
    o = option(name)
    return format_size(o.default) if o.kind == "size" else o.default


_PY_TYPES = {"choice": str, "size": str, "path": str, "int": int, "float": float, "bool": bool}


def with_pack_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` every option of :data:`h5forge.options.PACK_OPTIONS` as a Typer option.

    The options are declared once, in :mod:`h5forge.options`; ``pack`` and ``build`` take them
    from there instead of restating them. ``command`` receives them as one dict, its keyword
    ``pack_options`` (name -> value as typed; ``size`` as text), and lists them in ``--help``
    after its own parameters.
    """
    own = [
        p for name, p in pyinspect.signature(command).parameters.items() if name != "pack_options"
    ]
    added = []
    for o in PACK_OPTIONS:
        kind: Any = _PY_TYPES[o.kind]
        if o.optional:
            kind = kind | None
        added.append(
            pyinspect.Parameter(
                o.name,
                pyinspect.Parameter.KEYWORD_ONLY,
                default=pack_default(o.name),
                annotation=Annotated[kind, pack_flag(o.name)],
            )
        )

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        chosen = {o.name: kwargs.pop(o.name) for o in PACK_OPTIONS}
        return command(*args, pack_options=chosen, **kwargs)

    signature = pyinspect.Signature(
        [*(p.replace(kind=pyinspect.Parameter.KEYWORD_ONLY) for p in own), *added]
    )
    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return run


@app.command()
@with_pack_options
def pack(
    src: Annotated[Path, typer.Argument(help="dataset root: ImageFolder, or manifest's folder")],
    out: Annotated[Path, typer.Argument(help="the .h5 file to write")],
    pack_options: dict[str, Any],
) -> None:
    """Pack an image folder into a sealed HDF5 file (no Prefect)."""
    from h5forge.pack.config import PackConfig
    from h5forge.pack.writer import pack as do_pack
    from h5forge.preflight import check_destination, check_source
    from h5forge.preprocess.images import ImageConfig

    v = check_pack_options(pack_options)
    # The image policy, codec and checksums go to PackConfig, the rest (workers...) to pack().
    image_fields = {f.name for f in dataclasses.fields(ImageConfig)} & v.keys()
    codec_fields = {f.name for f in dataclasses.fields(PackConfig)} & v.keys()
    image = run_guarded(ImageConfig, **{k: v[k] for k in image_fields})
    config = run_guarded(PackConfig, image=image, **{k: v[k] for k in codec_fields})
    try:  # before any work: the source is there, the output can be written and is not in it
        check_source(str(src))
        check_destination(str(out), source=str(src), overwrite=v["overwrite"])
    except (OSError, ValueError) as e:
        raise usage_error(e) from e
    result = run_guarded(
        do_pack,
        src,
        out,
        what=str(out),
        config=config,
        progress=True,
        **{k: val for k, val in v.items() if k not in image_fields | codec_fields},
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
    file: str, manifest_url: str | None, *, sample_fraction: float, seed: int, progress: bool
) -> tuple[Any, str | None]:
    """Verify ``file``; then compare it with its manifest (the sidecar, or ``manifest_url``).

    Returns the report and the manifest URL checked (None when there is none beside the file).
    A manifest that changed while the file was verified (a republish) is checked again.
    """
    from h5forge.publish.storage import check_manifest, read_manifest
    from h5forge.publish.storage import manifest_url as sidecar
    from h5forge.summary import summarize
    from h5forge.verify.checks import verify as do_verify

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
        report = run_guarded(
            do_verify,
            file,
            what=file,
            sample_fraction=sample_fraction,
            seed=seed,
            progress=progress,
        )
        latest = run_guarded(load)
        if latest == manifest:
            break
        manifest = latest
    if manifest is None:
        return report, None
    counts = run_guarded(summarize, file)["counts"] if "counts" in manifest else None
    run_guarded(
        check_manifest,
        file,
        manifest,
        sha256=report.sha256,
        bytes=report.bytes,
        num_samples=report.num_samples,
        num_classes=report.num_classes,
        format_version=report.format_version,
        counts=counts,
    )
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
    if no_manifest:
        from h5forge.verify.checks import verify as do_verify

        report = run_guarded(
            do_verify,
            file,
            what=file,
            sample_fraction=sample_fraction,
            seed=seed,
            progress=not as_json,
        )
        checked = None
    else:
        report, checked = _verify_with_manifest(
            file, manifest, sample_fraction=sample_fraction, seed=seed, progress=not as_json
        )
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


def _lines(value: Any, indent: str) -> list[str]:
    """``key: value`` lines of a JSON-like value, nested mappings indented."""
    if not isinstance(value, dict):
        return [f"{indent}{printable(json.dumps(value, ensure_ascii=False))}"]
    out = []
    for key, item in sorted(value.items()):
        if isinstance(item, dict) and item:
            out.append(f"{indent}{printable(key)}:")
            out.extend(_lines(item, indent + "  "))
        else:
            shown = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
            out.append(f"{indent}{printable(key)}: {printable(shown)}")
    return out


def format_summary(info: Mapping[str, Any]) -> str:
    """The readable ``inspect`` text of :func:`h5forge.summary.summarize`'s dict."""
    attrs = info.get("attributes", {})
    get = attrs.get
    counts: dict[str, dict[str, int]] = info.get("counts", {})
    quarantined = info.get("quarantined", [])
    shape = info.get("image_shape")
    shown_shape = "x".join(map(str, shape)) if isinstance(shape, list) else str(shape)
    lines = [
        f"file:         {printable(info.get('url', ''))}",
        f"sealed:       {'yes' if info.get('sealed') else 'NO (not a finished asset)'}",
        f"format:       {printable(get('format', '?'))} v{get('format_version', '?')}, "
        f"written by h5forge {printable(get('h5forge_version', '?'))} at "
        f"{printable(get('created_at', '?'))}",
        f"layout:       {printable(get('layout', '?'))} ({printable(get('storage', '?'))} "
        f"storage, encoding {printable(get('encoding', '?'))}, mode {printable(get('mode', '?'))},"
        f" images {printable(shown_shape)})",
        f"compression:  {printable(get('compression', 'none'))}",
        f"size:         {int(info.get('bytes', 0)):,} bytes",
        f"samples:      {get('num_samples', '?')} in {get('num_classes', '?')} classes, "
        f"{get('num_quarantined', len(quarantined))} quarantined",
    ]
    if get("source_url"):
        lines.append(
            f"source:       {printable(get('source_url'))}"
            + (f" (sha256 {printable(get('source_sha256'))})" if get("source_sha256") else "")
        )
    lines.append("counts:")
    for split, per_class in sorted(counts.items()):
        total = sum(per_class.values())
        per = ", ".join(f"{printable(c)} {n}" for c, n in per_class.items())
        lines.append(f"  {printable(split) or '(all)'}: {total} ({per})")
    config = info.get("config") or ""
    try:
        parsed = json.loads(config) if isinstance(config, str) and config else config
    except ValueError:
        parsed = config
    lines.append("config:")
    lines.extend(_lines(parsed, "  ") if parsed else ["  (none)"])
    total_bad = get("num_quarantined", len(quarantined))
    lines.append(f"quarantined:  {total_bad}")
    for path, reason in quarantined:
        lines.append(f"  {printable(path)}: {printable(reason)}")
    if isinstance(total_bad, int) and total_bad > len(quarantined):
        lines.append(
            f"  ... and {total_bad - len(quarantined)} more (all are in the file's "
            "/quarantine group)"
        )
    return "\n".join(lines)


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


def main() -> None:
    """Console entry point of the library-only CLI."""
    app()


if __name__ == "__main__":
    main()

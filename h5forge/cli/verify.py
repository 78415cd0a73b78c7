"""``h5forge verify``: the file's own checks, then its sidecar; one report, text or JSON.

A sharded version (``--version``, or the latest of an asset published sharded) is checked by
:func:`h5forge.verify.sharded.verify_version`: its manifest, then every shard once; a failure
names each shard and what failed in it.

With ``--json`` the report is one JSON document on stdout whatever the outcome: on a failure it
says ``"ok": false`` and lists the failures, one per failed check, and the exit code is the
table's (1: the file failed a check; 2: nothing to verify by that name).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from h5forge.cli.exits import EXIT_USAGE, fail, run_guarded
from h5forge.cli.options import AssetName, AssetVersion, renamed_flag
from h5forge.errors import H5ForgeError, IntegrityError
from h5forge.text import printable

__all__ = ["verify"]


def _verify_with_sidecar(
    file: str, sidecar_url: str | None, verify_file: Callable[[], Any]
) -> tuple[Any, str | None]:
    """Verify ``file`` with ``verify_file()``; then compare it with its sidecar
    (``FILE.manifest.json``, or ``sidecar_url``).

    Returns the report and the sidecar URL checked (None when there is none beside the file).
    A sidecar that changed while the file was verified (a republish) is checked again.
    """
    from h5forge.location import Location
    from h5forge.publish.sidecar import check_verified, read_sidecar
    from h5forge.publish.sidecar import sidecar_url as sidecar_of
    from h5forge.summary import summarize

    target = sidecar_url or sidecar_of(file)

    def load() -> dict[str, Any] | None:
        try:
            return read_sidecar(target)
        except FileNotFoundError:
            if sidecar_url is not None:  # named on the command line: it must be there
                raise
            return None
        except ValueError as e:  # a sidecar that is not one is a failed check, not usage
            raise IntegrityError(str(e)) from e

    sidecar = load()
    for _ in range(3):
        report = verify_file()
        latest = load()
        if latest == sidecar:
            break
        sidecar = latest
    if sidecar is None:
        return report, None
    counts = summarize(Location(file))["counts"] if "counts" in sidecar else None
    check_verified(file, sidecar, report, counts=counts)
    return report, target


def _verify_sharded(
    asset: Any, sha: str, sidecar: str | None, sample_fraction: float, seed: int
) -> Any:
    """:func:`h5forge.verify.sharded.verify_version` of the sharded version ``sha``."""
    from h5forge.verify.sharded import verify_version

    if sidecar is not None:
        raise fail(
            "--sidecar: a sharded version has no sidecar (its manifest is checked, and every "
            "shard against it); leave --sidecar out",
            EXIT_USAGE,
        )
    return verify_version(asset, sha, sample_fraction=sample_fraction, seed=seed)


def _failed(resolved: dict[str, Any], e: BaseException) -> dict[str, Any]:
    """The JSON document of a failed verification: ``error``, its first line, and
    ``failures``, one per failed check (an IntegrityError lists them as "- " lines)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
    listed = [ln[2:] for ln in lines[1:] if ln.startswith("- ")]
    return {"ok": False, **resolved, "error": lines[0], "failures": listed or [" ".join(lines)]}


def verify(
    file: AssetName,
    version: AssetVersion = None,
    sample_fraction: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="fraction of the samples whose sha256 is recomputed, a seeded random subset "
            "(0.1: a tenth, faster on a large file); structure, labels, byte ranges and the "
            "file's sha256 are always checked in full",
        ),
    ] = 1.0,
    seed: Annotated[
        int,
        typer.Option(
            help="seed choosing the samples when --sample-fraction < 1 (same seed, same samples)"
        ),
    ] = 0,
    sidecar: Annotated[
        str | None,
        typer.Option(
            help="the sidecar to compare with (default: FILE.manifest.json when it exists)"
        ),
    ] = None,
    no_sidecar: Annotated[
        bool, typer.Option("--no-sidecar", help="do not compare with a sidecar")
    ] = False,
    # The old spellings: refused naming the new ones (the values never reach this body).
    manifest: Annotated[str | None, renamed_flag("--manifest", "--sidecar")] = None,
    no_manifest: Annotated[bool | None, renamed_flag("--no-manifest", "--no-sidecar")] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='print the report as one JSON document, on failure too ("ok": false, '
            '"failures": one line per failed check)',
        ),
    ] = False,
) -> None:
    """Verify structure, labels, byte ranges, digests, and the sidecar; exit 1 on any failure.

    When FILE.manifest.json is beside FILE (or --sidecar names one), its sha256, size, counts
    and format version must agree with the file. A sharded version: its manifest, then every
    shard once (its address, size, every check above, its label map and counts); a failure
    names the shard.
    """
    if no_sidecar and sidecar is not None:
        raise fail("--sidecar and --no-sidecar contradict each other; give one", EXIT_USAGE)
    from h5forge.location import Location
    from h5forge.publish.named import resolve_named
    from h5forge.verify.checks import verify as do_verify

    resolved = {"path": file, "version": version}  # the file once its name is resolved

    def check() -> tuple[Any, str | None, str]:
        asset = Location(file)
        url, sha, kind = resolve_named(asset, version)
        resolved.update(path=url, version=sha)
        if kind == "sharded":
            return _verify_sharded(asset, sha, sidecar, sample_fraction, seed), None, sha

        def verify_file() -> Any:
            return do_verify(url, sample_fraction=sample_fraction, seed=seed, progress=not as_json)

        if no_sidecar:
            return verify_file(), None, sha
        return (*_verify_with_sidecar(url, sidecar, verify_file), sha)

    def check_reporting_failures() -> tuple[Any, str | None, str]:
        try:
            return check()
        except (H5ForgeError, OSError, ValueError) as e:
            if as_json:  # a document on stdout; the error line and the exit code as ever
                typer.echo(json.dumps(_failed(resolved, e), indent=2, ensure_ascii=True))
            raise

    report, checked, sha = run_guarded(check_reporting_failures, what=file)
    sharded = hasattr(report, "shards")
    if as_json:
        fields = dataclasses.asdict(report)
        document = {**fields, "sidecar": checked, "version": report.sha256 if sharded else sha}
        typer.echo(json.dumps({"ok": True, **document, "failures": []}, indent=2))
        return
    if sharded:
        typer.echo(
            f"OK {printable(report.path)}: {report.num_samples} samples, "
            f"{report.num_classes} classes, {len(report.shards)} shards of {report.bytes:,} "
            f"bytes, version {report.sha256}, {report.checked_samples} digests checked in "
            f"{report.seconds:.2f} s; the manifest and every shard checked (a sharded version "
            "has no sidecar)"
        )
        return
    against = (
        f"; matches its sidecar {printable(checked)}"
        if checked
        else "; no sidecar checked" + ("" if no_sidecar else " (none beside it)")
    )
    typer.echo(
        f"OK {printable(report.path)}: {report.num_samples} samples, "
        f"{report.num_classes} classes, {report.bytes:,} bytes, sha256 {report.sha256}, "
        f"{report.checked_samples} digests checked in {report.seconds:.2f} s{against}"
    )

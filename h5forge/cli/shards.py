"""``h5forge compact`` and ``h5forge purge``: rewrite shards of a sharded asset
(:mod:`h5forge.publish.rewrite`)."""

from __future__ import annotations

from typing import Annotated

import typer

from h5forge.cli.exits import EXIT_USAGE, fail, run_guarded
from h5forge.text import printable

__all__ = ["compact", "purge"]

Base = Annotated[
    str,
    typer.Argument(
        help="the asset: the name it was built to, DEST.h5, or its base DEST (a path or "
        "fsspec URL)",
        show_default=False,
    ),
]


def compact(
    url: Base,
    below: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="rewrite the shards with fewer than this share of rows live"
        ),
    ] = 0.5,
) -> None:
    """Publish a new latest version whose mostly-deleted shards hold only their live rows."""
    from h5forge.location import Location
    from h5forge.publish.rewrite import compact as run

    result = run_guarded(run, run_guarded(Location, url, what=url), below, what=url)
    if not result.shards_rewritten:
        typer.echo(f"{printable(url)}: no shard below {below:g} live; nothing written")
        return
    typer.echo(
        f"{printable(url)}: {len(result.shards_rewritten)} shards rewritten; latest version "
        f"{result.latest[:16]}"
    )


def purge(
    url: Base,
    path: Annotated[
        list[str],
        typer.Option(
            "--path",
            metavar="PATH",
            help="a sample's path in the source, as the asset records it (repeat for more; "
            "default: none, and at least one is needed)",
            show_default=False,
        ),
    ] = None,  # type: ignore[assignment]
) -> None:
    """Remove samples' bytes from every version of a sharded asset (a takedown): the shards
    holding them are rewritten without them, every version gets a new manifest, and the old
    shards are deleted. Remove them from the source too, or the next build adds them back."""
    from h5forge.location import Location
    from h5forge.publish.rewrite import purge as run

    if not path:
        raise fail(
            "purge needs at least one --path PATH (a sample's path in the source)", EXIT_USAGE
        )
    result = run_guarded(run, run_guarded(Location, url, what=url), path, what=url)
    typer.echo(
        f"{printable(url)}: {result.removed_samples} rows removed from "
        f"{len(result.shards_rewritten)} shards; {len(result.versions)} versions written anew; "
        f"latest version {result.latest[:16] or '-'}"
    )

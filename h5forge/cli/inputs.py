"""What ``pack`` and ``build`` check before any work: the same checks, in the same order.

First the pack options, alone and together (:func:`check_options`, the library's own rules:
:func:`h5forge.cli.options.check_pack_options`, then the configuration they make); ``build``
then checks its own options (``BuildConfig``); last the source and the destination
(:func:`check_paths`, :mod:`h5forge.preflight`). So the same mistake (``--size 0``, a source
that is not there, a URL of a protocol fsspec does not know or of a host that does not exist,
a destination that exists) gets the same ``error:`` line and exit 2 from both commands, in well
under a second: nothing slow (Prefect, a server, the source's bytes) is started first.

Once they pass, :func:`start_workers_early` starts the decode pool's fork server, so that its
imports overlap the command's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h5forge.cli.exits import run_guarded, usage_error
from h5forge.cli.options import check_pack_options
from h5forge.text import printable

if TYPE_CHECKING:
    from h5forge.pack.config import PackConfig

__all__ = ["CheckedOptions", "check_options", "check_paths", "start_workers_early"]


@dataclasses.dataclass(frozen=True)
class CheckedOptions:
    """The pack options once checked.

    Attributes:
        values: every option, as :func:`h5forge.cli.options.check_pack_options` gives them
            (``size`` as ``(H, W)`` or None).
        config: the image policy, codec and checksums they make.
        rest: the options :func:`h5forge.pack.writer.pack` takes besides ``config``
            (``workers``, ``max_bad_fraction``, the source layout...).
    """

    values: dict[str, Any]
    config: PackConfig
    rest: dict[str, Any]


def check_options(pack_options: Mapping[str, Any]) -> CheckedOptions:
    """Check each pack option, then the rules across them; exit 2 at the first problem.

    Raises:
        typer.Exit: exit code 2, after printing the one ``error:`` line.
    """
    from h5forge.pack.config import PackConfig
    from h5forge.preprocess.config import ImageConfig

    v = check_pack_options(pack_options)
    image_fields = {f.name for f in dataclasses.fields(ImageConfig)} & v.keys()
    codec_fields = {f.name for f in dataclasses.fields(PackConfig)} & v.keys()
    image = run_guarded(ImageConfig, **{k: v[k] for k in image_fields})
    config = run_guarded(PackConfig, image=image, **{k: v[k] for k in codec_fields})
    rest = {k: val for k, val in v.items() if k not in image_fields | codec_fields}
    return CheckedOptions(values=v, config=config, rest=rest)


def check_paths(source: str, dest: str, *, replace: bool, local_only: bool = False) -> None:
    """Check the source, then the destination; exit 2 at the first problem.

    Args:
        source: the SOURCE argument as typed (a path or a URL).
        dest: the DEST argument as typed.
        replace: an existing destination may be replaced (``--overwrite``; ``build
            --versioned`` never writes over one).
        local_only: ``pack``: it neither fetches nor publishes, so both must be local paths.

    Raises:
        typer.Exit: exit code 2, after printing the one ``error:`` line.
    """
    from h5forge.location import Location
    from h5forge.preflight import (
        check_destination,
        check_not_in_source,
        check_source,
        check_url,
        local_path,
    )
    from h5forge.workdir import remove_dead_runs

    # A killed run's work folder (a file as large as its dataset) goes now, also when this run
    # is refused below (its destination exists, say) and never packs.
    with contextlib.suppress(OSError):
        remove_dead_runs()

    try:
        check_source(source)
        if local_only:
            for what, url in (("source", source), ("destination", dest)):
                if local_path(url) is None:
                    raise ValueError(
                        f"{what} {printable(url)} is a URL: `h5forge pack` reads and writes "
                        "local paths; fetch from or publish to a URL with `h5forge build`"
                    )
        if local_path(dest) is None:  # remote: whether it exists needs its keys (the flow)
            check_url(dest, what="destination", writable=True)
            check_not_in_source(source, dest)
        else:
            check_destination(Location(dest), source=source, overwrite=replace)
    except (OSError, ValueError) as e:
        raise usage_error(e) from e


def start_workers_early(source: str, workers: int | None) -> None:
    """Once the checks passed: start the decode pool's fork server now, when ``source`` is a
    local folder that holds enough files for a pool, so that its imports (the decoders, torch:
    ~1 s of CPU) run beside this process's own (the packer, or Prefect and its server)."""
    from h5forge.preflight import local_path
    from h5forge.preprocess.workers import POOL_FROM, start_early

    folder = local_path(source)
    if workers == 1 or folder is None or not _holds_files(folder, POOL_FROM):
        return
    start_early(workers)


def _holds_files(folder: Path, n: int, *, look: int = 512) -> bool:
    """Whether ``folder``'s tree holds at least ``n`` files, looking at no more than ``look``
    entries (a hint for starting the workers early, never a check)."""
    found, seen, stack = 0, 0, [folder]
    while stack and seen < look:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    seen += 1
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    elif e.is_file(follow_symlinks=False):
                        found += 1
                        if found >= n:
                            return True
                    if seen >= look:
                        break
        except OSError:
            continue
    return False

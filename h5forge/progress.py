"""Progress reporting for transfers: a rich bar when asked for, otherwise nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

__all__ = ["Progress", "progress_bar"]


class Progress(Protocol):
    """What transfer code calls; both methods are cheap no-ops when progress is off."""

    def advance(self, n: int) -> None: ...
    def reset(self, completed: int, total: int | None) -> None: ...


class _Silent:
    def advance(self, n: int) -> None:
        pass

    def reset(self, completed: int, total: int | None) -> None:
        pass


class _Rich:
    def __init__(self, bar: object, task: object) -> None:
        self._bar = bar
        self._task = task

    def advance(self, n: int) -> None:
        self._bar.update(self._task, advance=n)  # type: ignore[attr-defined]

    def reset(self, completed: int, total: int | None) -> None:
        self._bar.update(self._task, completed=completed, total=total)  # type: ignore[attr-defined]


@contextmanager
def progress_bar(enabled: bool, description: str, total: int | None = None) -> Iterator[Progress]:
    """Yield a :class:`Progress`; draws a byte-count bar on stderr only when ``enabled``."""
    if not enabled:
        yield _Silent()
        return
    # Imported lazily: rich is only needed when a human is watching.
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with RichProgress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield _Rich(bar, task)

"""The progress of a pack: a rich bar when asked for, plus the caller's callback."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["PackProgress"]


class PackProgress:
    """A rich progress bar when ``show``, plus ``callback(done, total)`` after each input."""

    def __init__(self, total: int, show: bool, callback: Callable[[int, int], None] | None):
        self.total, self.callback, self._bar, self._task = total, callback, None, None
        if show:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            # rich's default columns end in the time *remaining*, which reads 0:00:00 once the
            # pack is done (and on every line a log captures): show count, elapsed and rate.
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("pack", total=total, rate="")
        self._t0 = time.perf_counter()

    def advance(self, done: int) -> None:
        """``done`` of :attr:`total` inputs are processed."""
        if self._bar is not None:
            rate = done / max(time.perf_counter() - self._t0, 1e-9)
            self._bar.update(
                self._task,  # type: ignore[arg-type]
                completed=done,
                rate=f"{rate:,.0f} img/s",
            )
        if self.callback is not None:
            self.callback(done, self.total)

    def close(self) -> None:
        """Stop the bar (it stays on the terminal)."""
        if self._bar is not None:
            self._bar.stop()

"""A pack's target columns (format version 2): the schema as the file stores it, and
:class:`PackTargets`, the ``/targets`` sink whose spools are this run's files with the
statistics of the build report (:mod:`h5forge.targets.stats`).

The catalog's schema leaves each mask column's ``encoding`` open; the pack sets it from its
layout (:func:`stored_schema`): ``raw`` pixels in a decoded file, a ``png`` file in an encoded
one. Each column's bytes are spooled beside ``OUT.partial`` while packing, created exclusively
through the output lock like the blob spool (:mod:`h5forge.pack.sink`), so a planted link is
never written through and a killed run's spools are removed by the next one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import IO

from h5forge.options import Layout
from h5forge.output_lock import OutputLock
from h5forge.targets.schema import Column, Schema
from h5forge.targets.stats import TargetStats
from h5forge.targets.store import StoredTargets, TargetSink

__all__ = ["PackTargets", "stored_schema"]


def stored_schema(schema: Sequence[Column], layout: Layout) -> Schema:
    """``schema`` with every mask column's ``encoding`` set for ``layout``."""
    encoding = "raw" if layout == "decoded" else "png"
    return tuple(
        dataclasses.replace(c, encoding=encoding) if c.kind == "mask" else c for c in schema
    )


class PackTargets:
    """Every packed sample's stored targets, in order, into ``/targets`` and the statistics.

    Args:
        schema: the stored schema (:func:`stored_schema`), not empty.
        partial: ``OUT.partial``; the spools are ``PARTIAL.targets-NAME``, created exclusively
            through ``lock`` (removed with the run's other partial files).
        lock: the held output lock.
    """

    def __init__(self, schema: Schema, partial: str, lock: OutputLock) -> None:
        def spool(name: str) -> IO[bytes]:
            fd = lock.create(f"{partial}.targets-{name}", 0o600, flags=os.O_RDWR)
            return os.fdopen(fd, "w+b")

        self.sink = TargetSink(schema, spool)
        self.stats = TargetStats(schema)

    def add(self, raw: Sequence[object], stored: StoredTargets | None) -> None:
        """The next packed sample: its catalog values (``()`` for values carried as another
        file stored them, :mod:`h5forge.pack.carried`) and what is stored."""
        assert stored is not None, "a schema's samples carry their targets"
        self.sink.add(stored)
        self.stats.add(raw, stored)

    def close(self) -> None:
        """Close the spools."""
        self.sink.close()

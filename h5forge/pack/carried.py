"""Target values carried with reused samples: a pack that rewrites a file (a shard without some
of its rows, :mod:`h5forge.publish.rewrite`) keeps each kept row's target columns exactly as
that file stores them, the way its pixels are kept (:attr:`h5forge.pack.reuse.Reuse.targets`).

Nothing is decoded or encoded again: each row's stored bytes in each column are read through
HDF5 and handed to the pack's ``/targets`` sink as a
:class:`~h5forge.targets.store.StoredTargets`, as a worker hands the values it encoded. The
file is untrusted: its ``/targets`` layout was checked when its index was loaded
(:func:`h5forge.asset.target_layout.check_target_layout`: the datasets, their types, offsets
inside ``values``, the per-sample bounds, masks of their image's size), so each read is one
bounded slice; and each row's bytes are compared with its column's ``digests`` before they are
written again, so a damaged value is refused, never copied. The new file's seal then checks
every target value it holds against its column's rules (:mod:`h5forge.verify.targets`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import h5py
import numpy as np

from h5forge.asset.open import H5_DAMAGE
from h5forge.asset.stored_copy import StoredRun
from h5forge.errors import IntegrityError
from h5forge.targets.columns import Columns
from h5forge.targets.schema import Schema
from h5forge.targets.store import GROUP, StoredTargets

__all__ = ["CarriedRun", "CarriedTargets"]


@dataclass(frozen=True)
class CarriedRun(StoredRun):
    """A :class:`~h5forge.asset.stored_copy.StoredRun` with each sample's stored targets, in
    order (a pack with target columns copies no run without them)."""

    targets: tuple[StoredTargets, ...] = ()


class CarriedTargets:
    """The stored target values of the rows of an open file, each checked against its digest.

    Args:
        h5: the file, opened and its index loaded (so its ``/targets`` layout was checked);
            kept open by the caller while rows are read.
        schema: the file's target columns (the pack's own).
        where: the file, for messages.

    Raises:
        IntegrityError: HDF5 cannot read a column's index.
    """

    def __init__(self, h5: h5py.File, schema: Schema, *, where: str) -> None:
        self.schema, self.where = schema, where
        try:
            self._columns = Columns(h5, schema)
            self._digests = {c.name: h5[f"{GROUP}/{c.name}/digests"][()] for c in schema}
        except H5_DAMAGE as e:
            raise IntegrityError(
                f"{where}: /{GROUP} cannot be read ({type(e).__name__}: {e}); the file is "
                "damaged: verify it (`h5forge verify`)"
            ) from e

    def row(self, r: int) -> StoredTargets:
        """Row ``r``'s stored bytes in every column (schema order), with its masks' shapes.

        Raises:
            IntegrityError: a value does not read, or does not match its digest.
        """
        data: list[bytes] = []
        shapes: list[tuple[int, int] | None] = []
        for c in self.schema:
            at = f"/{GROUP}/{c.name}[{r}]"
            try:
                blob = self._columns.raw(c.name, r)
            except H5_DAMAGE as e:
                raise IntegrityError(f"{self.where}: {at} does not read ({e})") from e
            want = np.asarray(self._digests[c.name][r], np.uint8).tobytes()
            got = hashlib.sha256(blob)
            if got.digest() != want:
                raise IntegrityError(
                    f"{self.where}: {at} has sha256 {got.hexdigest()}, its column's digests "
                    f"say {want.hex()}: the file is damaged, nothing of it is copied; verify "
                    "it (`h5forge verify`)"
                )
            data.append(blob)
            if c.kind == "mask":
                h, w = (int(x) for x in self._columns.shapes[c.name][r])
                shapes.append((h, w))
            else:
                shapes.append(None)
        return StoredTargets(tuple(data), tuple(shapes))

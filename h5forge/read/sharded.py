"""A sharded version read as one dataset: one global index from the manifest, shards opened lazily.

:class:`H5ImageDataset <h5forge.read.dataset.H5ImageDataset>` reads a version whose pointer
(or ``version=``) names a manifest (:mod:`h5forge.publish.manifest`) through a
:class:`ShardedVersion`. Opening reads the manifest alone, checked against the version's
sha256: the dataset's length (with ``split=``, from each shard's ``splits`` counts), its
classes and the global order (shards in manifest order, each shard's live rows in file order)
need no shard. A shard is opened on first use, in the process that reads it (a DataLoader
worker), by the single-file machinery (:func:`h5forge.read.state.open_state`, with all its
checks) at the address recomputed from its sha256 (``BASE/shards/<sha256>.h5``, never a URL
taken from the manifest), and checked against its manifest entry before any sample is used:

* a local shard's size and ``metadata_sha256`` (recomputed) are the entry's (a remote one is
  checked by the verified cache, which keys it by its content address, or by ``verify_reads``);
* its sample count is the entry's, and its live rows of the split are as many as the entry says;
* its ``/classes`` map by name onto the version's classes (``labels``; ``-1``: a class that is
  not in the version, so a live row with it is refused); labels are handed out in the version's
  numbering;
* with ``target=`` other than ``"class"``, its target columns are the first shard's (the one
  shard opened when the dataset is made: ``target=`` is checked against it there).

Each refusal is an :class:`~h5forge.errors.IntegrityError` naming the shard.

A local shard is checked once per file, not once per process: :meth:`ShardedVersion.prepare`
(``loader()`` calls it before its workers start) checks every local shard in the process that
forks the workers, and each worker reopens a shard checked there only by its byte reader, after
comparing the file's identity (:mod:`h5forge.read.shard_check`); a changed file is checked in
full again.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.open import open_h5
from h5forge.asset.target_layout import file_schema
from h5forge.documents import DocumentError, parse_json
from h5forge.errors import IntegrityError
from h5forge.location import MAX_MANIFEST_BYTES, Location
from h5forge.publish.manifest import (
    MANIFEST_SUFFIX,
    ShardEntry,
    VersionManifest,
    check_labels,
    check_manifest,
    parse_manifest,
    read_manifest,
)
from h5forge.publish.versions import version_url
from h5forge.read import batches as _batches
from h5forge.read import collate as _collate
from h5forge.read.options import ReadOptions
from h5forge.read.provenance import MAX_JSON_BYTES, PROVENANCE_ATTRS
from h5forge.read.samples import read_batch, read_images, read_with_targets
from h5forge.read.shard_check import Identity, LocalCheck, reattach
from h5forge.read.state import ProcessState, open_state
from h5forge.read.targets import CLASS
from h5forge.redact import redact_url
from h5forge.targets.schema import Column

__all__ = ["ShardedVersion", "is_manifest"]


def is_manifest(url: str) -> bool:
    """Whether ``url`` names a version manifest (what a sharded version resolves to)."""
    return url.endswith(MANIFEST_SUFFIX)


def _manifest(where: Location, sha256: str, options: ReadOptions) -> VersionManifest:
    """The version's manifest, checked against ``sha256``: a remote one read from the cache
    when it holds it (no request: kept by its sha256, hashed again here), else from the
    server and then kept there for the next open."""
    cache = options.cache
    if cache is None or len(sha256) != 64 or where.is_local:
        return read_manifest(where, sha256)
    data = cache.version_manifest(sha256)
    if data is not None:  # hashed to sha256 as it was read
        return parse_manifest(data, shown=str(where))
    data = where.read_bytes(limit=MAX_MANIFEST_BYTES, what="version manifest")
    manifest = check_manifest(data, sha256, shown=str(where))
    cache.keep_manifest(sha256, data)
    return manifest


@dataclass
class _Shard:
    """One open shard: its state, the file rows of its dataset positions, its label map,
    and the identity of the local file its checks passed on (None: remote)."""

    state: ProcessState
    rows: np.ndarray
    lut: np.ndarray  # shard label -> version label (-1: not in the version)
    fixed: tuple[int, ...] | None  # image shape when fixed-size, decoded and unfiltered
    identity: Identity | None = None


class ShardedVersion:
    """The global index of a sharded version and this process's open shards.

    Args:
        where: the manifest (``BASE/v/<16 hex>/NAME.version.json``).
        sha256: the version's full sha256: the manifest's bytes must hash to it.
        options: how the dataset reads (``split`` selects, the rest as for one file).

    Raises:
        FileNotFoundError: no manifest there.
        IntegrityError: the manifest does not hash to ``sha256``.
        ValueError: a malformed manifest, or ``split`` no shard has.
    """

    def __init__(self, where: Location, sha256: str, options: ReadOptions) -> None:
        self.where, self.options = where, options
        self.manifest: VersionManifest = _manifest(where, sha256, options)
        self.base = where.url.rsplit("/", 3)[0]
        if version_url(self.base, sha256, "sharded") != where.url:
            raise ValueError(
                f"{where}: a version manifest lives at BASE/v/<16 hex>/NAME{MANIFEST_SUFFIX} "
                "under its asset's base; open the asset by its base and version"
            )
        split, m = options.split, self.manifest
        if split is not None and split not in m.split_names:
            raise ValueError(
                f"split {split!r} is not in {redact_url(where.url)}; it has "
                f"{list(m.split_names) or 'no splits'}"
            )
        counts = np.array(
            [s.live if split is None else int(s.splits.get(split, 0)) for s in m.shards],
            dtype=np.int64,
        )
        self.counts = counts
        self.ends = np.cumsum(counts)
        self.starts = self.ends - counts
        self.classes = list(m.classes)
        self._pid = os.getpid()
        self._open: dict[int, _Shard] = {}
        self._orphans: list[dict[int, _Shard]] = []
        self._paths: dict[int, np.ndarray] = {}
        # Local shards checked by prepare() (in this process or the one that forked it), their
        # handles closed: reopened by identity (shard_check.reattach), never read through.
        self._checked: dict[int, _Shard] = {}
        # Per dataset position, of the shards open in this process: byte range, version label
        # (a batch across shards gathers them with one index, not a pass per shard).
        self._flat: tuple[np.ndarray, np.ndarray] | None = None
        if options.target != CLASS and m.shards:
            self.shard(0)  # target= checked here, in the constructing process (a ValueError)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    # --- shards, opened lazily per process -------------------------------------------------
    def shard_url(self, k: int) -> str:
        """The URL of shard ``k``, recomputed from its sha256 under the asset's base."""
        return self.manifest.shard_url(self.base, self.manifest.shards[k])

    def open_many(self, ks: Sequence[int]) -> None:
        """Open the remote shards of ``ks`` not yet open here side by side, on threads: each
        open waits on the server (its head and tail, one latency) outside HDF5's lock, so a
        batch touching several new shards waits about one latency, not one per shard. Local
        shards, and a version read with ``target=``, open one by one on first use."""
        self._own()
        new = sorted({int(k) for k in ks} - self._open.keys())
        if len(new) < 2 or self.where.is_local or self.options.target != CLASS:
            return
        with ThreadPoolExecutor(min(8, len(new)), thread_name_prefix="h5forge-shard") as pool:
            opened = list(pool.map(lambda k: self._reopen(k) or self._open_shard(k), new))
        for k, found in zip(new, opened, strict=True):
            self._adopt(k, found)

    def shard(self, k: int) -> _Shard:
        """Shard ``k`` opened and checked in this process (on first use)."""
        self._own()
        found = self._open.get(k)
        if found is None:
            found = self._adopt(k, self._reopen(k) or self._open_shard(k))
        return found

    def _adopt(self, k: int, found: _Shard) -> _Shard:
        """``found``, shard ``k`` just opened, recorded as open here (its positions' ranges)."""
        if k not in self._open:
            self._open[k] = found
            if self._flat is None:
                self._flat = (np.zeros((len(self), 2), np.int64), np.zeros(len(self), np.int64))
            at = slice(int(self.starts[k]), int(self.ends[k]))
            self._flat[0][at] = found.state.index.byte_ranges[found.rows]
            self._flat[1][at] = found.lut[found.state.index.labels[found.rows]]
        return self._open[k]

    def _own(self) -> None:
        if self._pid != os.getpid():  # inherited through fork: never use or close the parent's
            self._orphans.append(self._open)  # handles (kept referenced, as one file's are)
            self._pid, self._open, self._paths, self._flat = os.getpid(), {}, {}, None

    def prepare(self) -> None:
        """Open and check every local shard the dataset reads, here, once, and close it again,
        so that processes forked after this (DataLoader workers; ``loader()`` calls this before
        its workers start) reopen each by identity instead of checking it again: ~10 ms a shard
        per worker per epoch without persistent workers. Remote shards are left to the workers
        (their downloads run there, in parallel), and so are the reads of shards whose images
        are filtered (through an HDF5 handle). Opens no handle that it keeps.

        Raises:
            FileNotFoundError, IntegrityError: as the workers would, naming the shard.
        """
        if not self.where.is_local:
            return
        self._own()
        for k in range(len(self.manifest.shards)):
            if not self.counts[k]:
                continue
            now = Identity.at(self.where.with_url(self.shard_url(k)))
            done = self._checked.get(k) or self._open.get(k)
            if done is None or done.identity != now:  # changed since: check it again, here
                self._checked.pop(k, None)
                done = self._open_shard(k)
                done.state.close()
            if done.identity is not None:
                self._checked[k] = done

    def _reopen(self, k: int) -> _Shard | None:
        """Shard ``k`` as :meth:`prepare` checked it, reading through a new descriptor, if it
        is still that file (None: open and check it in full)."""
        done = self._checked.get(k)
        if done is None or done.identity is None or done.state.index.filtered:
            return None  # filtered images are read through an HDF5 handle, opened with checks
        where = self.where.with_url(self.shard_url(k))
        st = reattach(done.state, where, done.identity)
        if st is None:
            del self._checked[k]  # changed: checked in full, and refused if it is another file
            return None
        return dataclasses.replace(done, state=st)

    def _open_shard(self, k: int) -> _Shard:
        entry = self.manifest.shards[k]
        where = self.where.with_url(self.shard_url(k))
        check = LocalCheck(where, entry) if where.is_local else None
        try:
            st = open_state(where, self.options, entry.sha256, check, size=entry.bytes)
        except ValueError as e:
            if self.options.target == CLASS or k == 0 or isinstance(e, IntegrityError):
                raise
            # Shard 0 was read with this target= (checked when the dataset was made).
            raise IntegrityError(
                f"shard {k} ({redact_url(where.url)}) cannot be read with target="
                f"{self.options.target!r:.200} as shard 0 is ({e}): its target columns differ; "
                "every shard of a version read with target= must have the same columns; read "
                "it with target='class', or rebuild the version"
            ) from None
        try:
            sh = self._check(k, entry, st)
        except BaseException:
            st.close()
            raise
        sh.identity = None if check is None else check.identity
        return sh

    def _check(self, k: int, entry: ShardEntry, st: ProcessState) -> _Shard:
        idx, shown = st.index, f"shard {k} ({redact_url(st.url)})"
        if idx.header.num_samples != entry.samples:
            raise IntegrityError(
                f"{shown} has {idx.header.num_samples} samples, its manifest entry says "
                f"{entry.samples}: the shard was replaced or the manifest is damaged"
            )
        try:
            check_labels(entry, list(idx.classes), self.manifest.classes)
        except IntegrityError as e:
            raise IntegrityError(f"{shown}: {e}") from None
        rows = entry.live_rows()
        split = self.options.split
        if split is not None:
            code = idx.split_names.index(split) if split in idx.split_names else -1
            rows = rows[idx.split_codes[rows] == code]
        if len(rows) != self.counts[k]:
            raise IntegrityError(
                f"{shown} has {len(rows)} live samples of split {split!r}, its manifest entry "
                f"says {int(self.counts[k])}: the shard was replaced or the manifest is damaged"
            )
        lut = np.asarray(entry.labels, dtype=np.int64)
        mapped = lut[idx.labels[rows]] if len(lut) else np.full(len(rows), -1, np.int64)
        if (mapped < 0).any():
            r = int(rows[np.flatnonzero(mapped < 0)[0]])
            raise IntegrityError(
                f"{shown}: sample {r} has class {idx.classes[int(idx.labels[r])]!r}, which the "
                "version does not have (its manifest maps it to -1) yet keeps the sample: the "
                "manifest is damaged; publish the version again"
            )
        if self.options.target != CLASS and k != 0:
            first = self.shard(0).state.index.header
            if file_schema(idx.header, where=st.url) != file_schema(first, where=st.url):
                raise IntegrityError(
                    f"{shown} has target columns {file_schema(idx.header, where=st.url)!r:.300}, "
                    f"shard 0 has {file_schema(first, where=st.url)!r:.300}: every shard of a "
                    "version read with target= must have the same columns; read it with "
                    "target='class', or rebuild the version"
                )
        fixed = idx.header.storage == "array" and not idx.filtered
        return _Shard(st, rows, lut, idx.image_shape if fixed else None)

    def close(self) -> None:
        """Release this process's shard handles (they reopen on the next access)."""
        if self._pid == os.getpid():
            for sh in self._open.values():
                sh.state.close()
        self._open = {}

    # --- where an index lives ------------------------------------------------------------
    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, position within the shard)`` of in-range dataset ``positions``."""
        k = np.searchsorted(self.ends, positions, side="right")
        return k, positions - self.starts[k]

    def groups(self, positions: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``(shard, batch positions, file rows)`` of each shard ``positions`` touch."""
        k, local = self.locate(positions)
        out = []
        for s in np.unique(k).tolist():
            at = np.flatnonzero(k == s)
            out.append((s, at, self.shard(s).rows[local[at]]))
        return out

    # --- reading ---------------------------------------------------------------------------
    def items(self, positions: np.ndarray) -> list[tuple[Any, Any]]:
        """``(image, target)`` of each position (no transforms), in order."""
        out: list[Any] = [None] * len(positions)
        max_pixels = self.options.max_pixels
        for s, at, rows in self.groups(positions):
            sh = self.shard(s)
            st, r = sh.state, rows.tolist()
            labels = sh.lut[st.index.labels[rows]]
            if st.selection.columns or st.selection.as_dict:
                images, targets = read_with_targets(st, r, max_pixels=max_pixels, labels=labels)
            else:
                images, targets = read_images(st, r, max_pixels=max_pixels), labels.tolist()
            for p, image, target in zip(at.tolist(), images, targets, strict=True):
                out[p] = (image, target)
        return out

    def read_batch(self, positions: np.ndarray, *, slot: bool, shared: bool) -> Any:
        """The batch of ``positions`` read in place (fixed-size decoded shards, no transform):
        one batch buffer across shards, each shard's share with one ``read_into``; None when
        it cannot be (the caller reads item by item)."""
        if self.options.transformed:
            return None
        parts = self._parts(positions)
        self.open_many([s for s, _ in parts])
        if len(parts) == 1:  # one shard: the single-file path, target columns included
            s = parts[0][0]
            sh = self.shard(s)
            if sh.fixed is None:
                return None
            rows = sh.rows[positions - self.starts[s]]
            labels = sh.lut[sh.state.index.labels[rows]]
            return read_batch(sh.state, rows.tolist(), slot=slot, shared=shared, labels=labels)
        if self.options.target != CLASS:
            return None
        shapes = {self.shard(s).fixed for s, _ in parts}
        hwc = shapes.pop() if len(shapes) == 1 else None
        if hwc is None:
            return None
        batch = _batches.Batch(len(positions), hwc, slot=slot, shared=shared)
        try:
            view = memoryview(batch.flat.numpy()).cast("B")  # type: ignore[arg-type]
            size = int(math.prod(hwc))
            bufs = [view[p * size : (p + 1) * size] for p in range(len(positions))]
            batch.labels.numpy()[:] = self.fill(positions, bufs, parts)
        except BaseException:
            batch.release()
            raise
        return batch.result()

    def shapes(self, positions: np.ndarray) -> set[tuple[int, ...] | None]:
        """The image shapes of the shards ``positions`` touch (None: one is not fixed-size,
        decoded and unfiltered)."""
        return {self.shard(s).fixed for s, _ in self._parts(positions)}

    def fill(
        self,
        positions: np.ndarray,
        bufs: Sequence[memoryview],
        parts: list[tuple[int, np.ndarray]] | None = None,
    ) -> np.ndarray:
        """Read the fixed-size samples of ``positions`` into ``bufs`` (one each), each shard's
        share with one ``read_into`` (remote shards' blocks asked for before the first share
        is read: one latency for a batch across three shards, not three); return their labels
        in the version's numbering. ``parts``: the shards ``positions`` touch, if known."""
        parts = self._parts(positions) if parts is None else parts
        states = [self.shard(s).state for s, _ in parts]  # opened: their rows are in _flat
        assert self._flat is not None
        ranges = self._flat[0][positions].tolist()
        if len(parts) > 1 and not self.where.is_local:  # each reader's fetch ahead, at once
            for (_, at), st in zip(parts, states, strict=True):
                if st.reader is not None and not st.index.filtered:
                    st.reader.prefetch([ranges[p] for p in at.tolist()])
        for (s, at), st in zip(parts, states, strict=True):
            assert st.reader is not None
            batch_at = at.tolist()
            mine = [bufs[p] for p in batch_at]
            st.reader.read_into([ranges[p] for p in batch_at], mine)
            if st.digests is not None:
                rows = self._open[s].rows[positions[at] - self.starts[s]]
                st.check(mine, rows.tolist())
        return self._flat[1][positions]

    def prefetch(self, positions: np.ndarray) -> None:
        """Start fetching, in the background, the bytes of ``positions`` in remote shards
        (:meth:`h5forge.asset.ranges.RangeReader.prefetch`); a shard not yet open is opened."""
        parts = self._parts(positions)
        self.open_many([s for s, _ in parts])
        for s, at in parts:
            sh = self.shard(s)
            reader = sh.state.reader
            if reader is None or reader.remote is None or sh.state.index.filtered:
                continue
            rows = sh.rows[positions[at] - self.starts[s]]
            reader.prefetch(sh.state.index.byte_ranges[rows].tolist())

    def _parts(self, positions: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``(shard, batch positions)`` of each shard ``positions`` touch, in shard order: the
        grouping of :meth:`groups` without the file rows (one sort, not a pass per shard)."""
        k = np.searchsorted(self.ends, positions, side="right")
        order = np.argsort(k, kind="stable")
        cuts = np.flatnonzero(np.diff(k[order])) + 1
        return [(int(k[at[0]]), at) for at in np.split(order, cuts) if len(at)]

    def collate(self, items: Sequence[tuple[Any, Any]], *, slot: bool) -> Any:
        """Items of :meth:`items` batched as one file's would be."""
        st = self.shard(0).state if len(self) else None
        if st is not None and (st.selection.columns or st.selection.as_dict):
            return st.selection.batch(items, url=self.where.url)
        return _collate.collate(list(items), slot=slot, url=self.where.url)

    def labels(self) -> np.ndarray:
        """Every sample's label in the version's numbering (opens every shard)."""
        parts = [np.zeros(0, np.int64)]
        for s in range(len(self.manifest.shards)):
            if self.counts[s]:
                sh = self.shard(s)
                parts.append(sh.lut[sh.state.index.labels[sh.rows]])
        return np.concatenate(parts)

    def schema(self) -> tuple[Column, ...]:
        """The target columns (the first shard's; every shard read with target= has them)."""
        if not self.manifest.shards:
            return ()
        st = self.shard(0).state
        return file_schema(st.index.header, where=st.url)

    # --- where samples came from -----------------------------------------------------------
    def source_paths(self, positions: np.ndarray) -> list[str]:
        """The source path of each position (each shard's ``/paths`` read once here)."""
        out: list[str] = [""] * len(positions)
        for s, at, rows in self.groups(positions):
            paths = self._paths.get(s)
            if paths is None:
                with open_h5(self.where.with_url(self.shard_url(s))) as h5:
                    paths = np.asarray(h5[fmt.PATHS].asstr()[()], dtype=object).reshape(-1)
                self._paths[s] = paths
            for p, r in zip(at.tolist(), rows.tolist(), strict=True):
                out[p] = str(paths[r])
        return out

    def provenance(self) -> dict[str, Any]:
        """The provenance keys of one file's (:mod:`h5forge.read.provenance`), from the
        manifest; besides them ``lineage`` (the build's lineage fields) and ``shards``."""
        m = self.manifest
        fields = {
            fmt.A_SOURCE_URL: m.source_url,
            fmt.A_SOURCE_SHA256: m.source_sha256,
            fmt.A_SOURCE_FINGERPRINT: m.source_fingerprint,
            fmt.A_CREATED_AT: m.created_at,
            fmt.A_H5FORGE_VERSION: m.h5forge_version,
            fmt.A_CONFIG_SHA256: m.config_sha256,
            fmt.A_PARENT_SHA256: m.parent,
        }
        found: dict[str, Any] = {k: fields.get(k) or m.lineage.get(k, "") for k in PROVENANCE_ATTRS}
        found["config"] = _json(m.config_json)
        found["changes"] = _json(m.lineage.get(fmt.A_CHANGES_JSON, ""))
        found["lineage"] = dict(m.lineage)
        found["shards"] = len(m.shards)
        return found


def _json(text: str) -> Any:
    if not text or len(text) > MAX_JSON_BYTES:
        return None
    try:
        return parse_json(text, what="manifest field", name="manifest")
    except DocumentError:
        return None

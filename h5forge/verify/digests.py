"""Verify sample bytes against ``/digests`` (and the whole file's sha256) in one read pass.

Sample digests and the whole-file sha256 are computed in one sequential pass over the file: the
file hash runs in a helper thread on the same buffer (hashlib releases the GIL) while this
thread hashes the samples in it, so a full verify costs about one sha256 of the file on two
cores. Without the file hash (the writer's check before sealing) a local file's samples are
hashed on every usable CPU at once, each thread over a contiguous part of the file. Both passes
are one block loop, :func:`_scan`.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from h5forge.asset.index import AssetIndex
from h5forge.cpus import usable_cpus
from h5forge.files import open_regular
from h5forge.location import Location
from h5forge.platforms import require_calls

__all__ = ["OnSample", "check_samples", "hash_local_ranges"]

_BLOCK = 8 << 20

# ``on_sample(i, sha256 digest, stored bytes or None)``, once per sample range hashed.
OnSample = Callable[[int, bytes, bytes | None], None]


class _Hasher:
    """Hashes sample byte ranges from consecutive blocks of one pass over (part of) a file."""

    def __init__(
        self,
        ranges: list[tuple[int, int, int]],
        want_data: bool,
        on_sample: OnSample,
    ) -> None:
        self.ranges, self.want_data, self.on_sample = ranges, want_data, on_sample
        self.k = 0
        self.partial: Any = None  # running sha256 of a sample that continues in the next block
        self.pending = bytearray()

    def feed(self, pos: int, view: memoryview) -> None:
        """Hash every sample (part) inside ``view``, the file's bytes from ``pos``."""
        end = pos + len(view)
        ranges = self.ranges
        while self.k < len(ranges) and ranges[self.k][1] < end:
            i, start, size = ranges[self.k]
            lo, hi = max(start, pos), min(start + size, end)
            part = view[lo - pos : hi - pos]
            if self.partial is None:
                self.partial = hashlib.sha256(part)  # no copy; releases the GIL on large parts
            else:
                self.partial.update(part)
            if self.want_data:
                self.pending += part
            if start + size > end:
                return
            self.on_sample(
                i, self.partial.digest(), bytes(self.pending) if self.want_data else None
            )
            self.partial = None
            self.pending.clear()
            self.k += 1


def _scan(
    readinto: Callable[[memoryview, int], int],
    pos: int,
    stop: int | None,
    hasher: _Hasher,
    on_bytes: Callable[[int], None],
    file_hash: Any = None,
) -> None:
    """Read the file from ``pos`` to ``stop`` (its end when None) block by block into
    ``hasher``; with ``file_hash``, each block is also hashed whole on a helper thread.

    ``readinto(view, pos)`` fills ``view`` from the file at ``pos`` and returns the bytes read
    (0 at the end). With a file hash there are two buffers, so reading never waits for either
    hash; the helper's hash of a buffer is awaited before the buffer is read into again.
    """
    buffers = [bytearray(_BLOCK) for _ in range(1 if file_hash is None else 2)]
    busy: list[Future[None] | None] = [None] * len(buffers)
    b = 0
    with ThreadPoolExecutor(1) if file_hash is not None else contextlib.nullcontext() as pool:
        while stop is None or pos < stop:
            hashing = busy[b]
            if hashing is not None:
                hashing.result()  # the helper is done with this buffer
            want = _BLOCK if stop is None else min(_BLOCK, stop - pos)
            n = readinto(memoryview(buffers[b])[:want], pos)
            if not n:
                break  # past the end: the caller reports the samples never seen
            view = memoryview(buffers[b])[:n]
            if pool is not None:
                busy[b] = pool.submit(file_hash.update, view)
            hasher.feed(pos, view)
            on_bytes(n)
            pos += n
            b = (b + 1) % len(buffers)
        for hashing in busy:
            if hashing is not None:
                hashing.result()


def _stream(
    where: Location,
    ranges: list[tuple[int, int, int]],
    on_sample: OnSample,
    on_bytes: Callable[[int], None],
    *,
    want_data: bool,
) -> str:
    """One sequential pass: returns the file sha256; ``on_sample(i, sha256, bytes)`` per range."""
    file_hash = hashlib.sha256()
    hasher = _Hasher(sorted(ranges, key=lambda r: r[1]), want_data, on_sample)
    if not where.is_local:  # ranged reads, each bounded in time (a trickle is cut off)
        size = int(where.ask("the size", "size", where.path))

        def remote(view: memoryview, pos: int) -> int:
            data = where.read_range(pos, min(size, pos + len(view))) if pos < size else b""
            view[: len(data)] = data
            return len(data)

        _scan(remote, 0, None, hasher, on_bytes, file_hash)
        return file_hash.hexdigest()
    with os.fdopen(open_regular(where.path, "file"), "rb", buffering=0) as f:  # never a FIFO
        _scan(lambda view, _: int(f.readinto(view)), 0, None, hasher, on_bytes, file_hash)
    return file_hash.hexdigest()


def hash_local_ranges(
    path: str,
    ranges: list[tuple[int, int, int]],
    on_sample: OnSample,
    on_bytes: Callable[[int], None],
    *,
    mapped: bool = False,
) -> None:
    """Hash ``ranges`` (``(i, offset, size)``) of a local file on every usable CPU, each thread
    reading a contiguous part of it; ``on_sample(i, sha256, None)`` is called from those
    threads once per range read. A range past the end of the file is never reported.

    ``mapped`` hashes the page cache's pages in place through a read-only ``mmap`` instead
    of copying them out with ``preadv`` (a third less CPU): only for a file this process
    created and holds, as a pack's own file before its seal, since a mapped file that another
    process shortens meanwhile kills the reader with ``SIGBUS`` where ``preadv`` reads short.
    """
    ranges = sorted(ranges, key=lambda r: r[1])
    threads = max(1, min(usable_cpus(), 8, len(ranges)))
    require_calls("hashing a file's samples", "preadv")
    total = sum(r[2] for r in ranges)
    groups: list[list[tuple[int, int, int]]] = [[]]
    acc = 0
    for r in ranges:  # contiguous runs of about equal bytes, one per thread
        if acc >= total * len(groups) / threads and len(groups) < threads:
            groups.append([])
        groups[-1].append(r)
        acc += r[2]

    def run(group: list[tuple[int, int, int]]) -> None:
        if not group:
            return
        hasher = _Hasher(group, False, on_sample)
        fd = open_regular(path, "file")  # never waits on a FIFO swapped in
        try:
            start, stop = group[0][1], group[-1][1] + group[-1][2]
            if mapped:
                _scan_mapped(fd, start, stop, hasher, on_bytes)
            else:
                _scan(lambda view, pos: os.preadv(fd, [view], pos), start, stop, hasher, on_bytes)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as pool:
        for done in [pool.submit(run, g) for g in groups]:
            done.result()


def _scan_mapped(
    fd: int, start: int, stop: int, hasher: _Hasher, on_bytes: Callable[[int], None]
) -> None:
    """:func:`_scan` of ``[start, stop)`` of ``fd`` through a read-only mapping of it (up to
    the file's end), block by block."""
    stop = min(stop, os.fstat(fd).st_size)
    if stop <= start:
        return
    base = start - start % mmap.ALLOCATIONGRANULARITY
    mapping = mmap.mmap(fd, stop - base, prot=mmap.PROT_READ, offset=base)
    try:
        with memoryview(mapping) as whole:
            for pos in range(start, stop, _BLOCK):
                end = min(pos + _BLOCK, stop)
                with whole[pos - base : end - base] as view:
                    hasher.feed(pos, view)
                on_bytes(end - pos)
    finally:
        mapping.close()


def check_samples(
    where: Location,
    h5_digests: np.ndarray,
    idx: AssetIndex,
    chosen: list[int],
    filtered_reader: Callable[[int], bytes | None] | None,
    fails: list[str],
    on_bytes: Callable[[int], None],
    *,
    file_hash: bool,
    decode: bool,
    max_pixels: int,
    own: bool = False,
) -> str:
    """Check the digest of every chosen sample (and, with ``decode``, that encoded ones decode).

    Returns the file's sha256, or ``""`` without ``file_hash``: then a local file's samples are
    hashed on every usable CPU at once instead of in one sequential pass; ``own`` (a file this
    process created and holds: the writer's check before its seal) hashes them in the page
    cache through ``mmap`` instead of copying them out (see :func:`hash_local_ranges`).
    """
    from h5forge.preprocess.images import Encoding, decode_stored

    hdr = idx.header
    decode = decode and hdr.layout == "encoded"
    found: list[tuple[int, str]] = []  # (sample, failure): sorted at the end, threads race
    seen: set[int] = set()

    def check_decode(i: int, data: bytes) -> None:
        shape = tuple(int(x) for x in idx.shapes[i]) if idx.shapes is not None else None
        try:
            arr = decode_stored(
                data,
                shape,
                layout=hdr.layout,
                encoding=cast(Encoding, hdr.encoding),
                mode=hdr.mode,
                max_pixels=max_pixels,
            )
        except (OSError, ValueError, SyntaxError) as e:
            found.append((i, f"sample {i}: encoded bytes do not decode: {e}"))
            return
        if shape is not None and tuple(arr.shape) != shape:
            found.append((i, f"sample {i}: decodes to {tuple(arr.shape)}, /shapes says {shape}"))

    cpus = usable_cpus()
    with ThreadPoolExecutor(cpus if decode else 1) as decoders:  # Pillow releases the GIL
        decoding: deque[Future[None]] = deque()

        def on_sample(i: int, digest: bytes, data: bytes | None) -> None:
            seen.add(i)
            want = bytes(h5_digests[i])
            if digest != want:
                found.append(
                    (
                        i,
                        f"sample {i}: sha256 of stored bytes is {digest.hex()}, "
                        f"/digests says {want.hex()}",
                    )
                )
                return
            if decode:
                assert data is not None
                decoding.append(decoders.submit(check_decode, i, data))
                while len(decoding) > 2 * cpus:
                    decoding.popleft().result()

        ranges = [(i, int(idx.byte_ranges[i, 0]), int(idx.byte_ranges[i, 1])) for i in chosen]
        if filtered_reader is not None:
            for i in chosen:
                data = filtered_reader(i)
                if data is not None:  # None: unreadable, already listed in ``fails``
                    on_sample(i, hashlib.sha256(data).digest(), data)
            ranges = []
        if file_hash or not where.is_local:
            sha = _stream(where, ranges, on_sample, on_bytes, want_data=decode)
            sha = sha if file_hash else ""
        else:
            hash_local_ranges(where.path, ranges, on_sample, on_bytes, mapped=own)
            sha = ""
        for pending in decoding:
            pending.result()
    if filtered_reader is None:
        found += [
            (i, f"sample {i}: its byte range lies past the end of the file")
            for i in sorted(set(chosen) - seen)[:100]
        ]
    fails.extend(msg for _, msg in sorted(found, key=lambda f: f[0]))
    return sha

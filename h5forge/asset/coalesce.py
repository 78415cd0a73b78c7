"""Remote byte ranges in few large requests: coalescing, aligned read-ahead blocks, counters.

A remote read pays a fixed cost per request (latency, the server's per-request work) besides
its bytes, so :class:`RemoteRanges` plans a batch's reads in three steps:

1. **Kept blocks first.** Aligned blocks of ``block_bytes`` fetched earlier (up to
   ``keep_bytes`` of them, least recently used dropped first; all readers of a process
   together at most :data:`PROCESS_KEEP_BYTES`) serve every range they hold.
2. **Coalesce** the rest (:func:`coalesce`): two ranges closer than ``max_gap`` bytes share one
   request (the gap is read and counted as over-read), up to ``max_request`` bytes a request.
3. **Read ahead**: an aligned block that a request would read at least half of anyway is
   fetched whole and kept. With a block shuffle (:func:`h5forge.read.order.epoch_order` with
   ``block_size``) a batch's samples crowd a few blocks, so its first batch fetches the blocks
   and the next batches of the window find their samples kept; with a uniform shuffle samples
   are far apart, nothing is rounded up, and each is fetched exactly.

With a ``store`` (:class:`h5forge.read.block_cache.BlockStore`: blocks kept on local disk),
blocks the store holds serve their ranges like kept ones, and every block a request touches
is fetched whole and stored, while a batch's blocks fit ``keep_bytes`` (a uniform shuffle
over a large asset touches a block per sample: those batches read exactly what they need and
store only the blocks they read half of). A block to store is claimed first
(:class:`h5forge.read.block_cache.BlockClaims`): one another process is fetching (another
worker, whose batch shares it) is not asked for again but read from the store once it is kept,
after this batch's own requests; a fetch ahead keeps its blocks and releases their claims as
they arrive, on its own thread.

Adjacent whole blocks are fetched in one request of up to :data:`BLOCK_RUN_BYTES` and split
into blocks as they arrive. All requests of a batch go out at once (fsspec ``cat_ranges``:
concurrent, over the process's kept-alive connection pool). :class:`ReadStats` counts
requests, bytes and over-read; over-read is at most ``max_gap`` per merged gap plus the rest of
a block at least half read.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "BLOCK_RUN_BYTES",
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_KEEP_BYTES",
    "DEFAULT_MAX_GAP",
    "DEFAULT_MAX_REQUEST",
    "PROCESS_KEEP_BYTES",
    "STORED_KEEP_BYTES",
    "BlockSource",
    "ReadStats",
    "RemoteRanges",
    "coalesce",
]

# A gap is worth reading when it costs less than a request: at 20 ms per request and ~100 MB/s
# per connection a request costs about 2 MB of transfer; 1 MiB keeps the over-read below that.
DEFAULT_MAX_GAP = 1 << 20
# Largest request a merge makes (a single range larger than this is still fetched whole).
DEFAULT_MAX_REQUEST = 32 << 20
# Read-ahead unit: aligned blocks this large, fetched whole when a request reads half of one.
DEFAULT_BLOCK_BYTES = 8 << 20
# Fetched blocks one reader keeps for later batches.
DEFAULT_KEEP_BYTES = 64 << 20
# ... when a store (the cache) keeps every block on disk: a batch's blocks (a 64-sample batch
# of 150 KB samples touches ~5-9 blocks of 2 MiB), the rest come back from the page cache.
STORED_KEEP_BYTES = 24 << 20
# All readers of one process together (the files and shards it has open).
PROCESS_KEEP_BYTES = 96 << 20
# ... of those with a store: what they drop, the store gives back from the page cache (a
# sharded version's worker reads several shards at once: each would keep its own 24 MiB).
# 8 MiB, not 32: a 5-shard version's worker peaked 306-318 MB, not 331-344 (a local read's
# 232 MB), with the same epoch times (paired runs, benchmarks/RESULTS.md).
PROCESS_STORED_KEEP_BYTES = 8 << 20
# Adjacent whole blocks are fetched in one request up to this size (then split into blocks):
# a request costs the client and the server CPU and the store a GET, and S3 serves ranges of
# 8-16 MB at full speed; larger ones would leave the batch's other connections idle.
BLOCK_RUN_BYTES = 8 << 20


@dataclass
class ReadStats:
    """What one remote reader fetched: ``requests``, ``bytes`` (received), ``over_read`` (bytes
    fetched beyond the wanted ranges), ``kept_hits`` (runs served from kept blocks alone),
    ``stored_hits`` (blocks read from the ``store`` instead of the server), ``stored_puts``
    (prefetched blocks handed to the store)."""

    requests: int = 0
    bytes: int = 0
    over_read: int = 0
    kept_hits: int = 0
    stored_hits: int = 0
    stored_puts: int = 0


# cat_ranges(starts, ends) -> one bytes object (or exception) per range.
Fetch = Callable[[list[int], list[int]], list[Any]]


class BlockSource(Protocol):
    """Blocks kept beyond this process (:class:`h5forge.read.block_cache.BlockStore`), of
    ``block_bytes`` each: the reader's block size when it has a store."""

    block_bytes: int

    def get(self, k: int, size: int) -> bytes | None: ...

    def put(self, k: int, blob: bytes | memoryview) -> None: ...

    def complete(self, fetch: Fetch) -> None:
        """Called after each read of a batch: a store may finish itself (fetching what is
        missing with ``fetch``), and raise what finishing itself met."""

    def local_fd(self) -> int | None:
        """A descriptor of the whole file, validated, once the store holds it (else None)."""

    def has(self, k: int) -> bool:
        """Whether block ``k`` is kept (cheap: no read; :meth:`get` still checks it)."""

    def claim(self, k: int) -> bool:
        """Whether this process should fetch block ``k`` now (False: another one is fetching
        it, and :meth:`wait` gives it once kept; :class:`h5forge.read.block_cache.BlockClaims`)."""

    def release(self, k: int) -> None:
        """This process's claim on block ``k`` dropped (kept, or its fetch failed)."""

    def wait(self, sizes: Mapping[int, int]) -> dict[int, bytes]:
        """The blocks of ``sizes`` (block -> size) that others claimed, once kept (bounded in
        time); those missing from the result are the caller's to fetch."""


def coalesce(
    starts: Sequence[int], ends: Sequence[int], *, max_gap: int, max_request: int
) -> list[tuple[int, int]]:
    """Merge sorted, non-overlapping ``[starts[i], ends[i])`` into ``(start, end)`` requests.

    Neighbours are merged while the gap between them is below ``max_gap`` and the request stays
    within ``max_request`` bytes (a single larger range is one request of its own).
    """
    out: list[tuple[int, int]] = []
    for a, b in zip(starts, ends, strict=True):
        if out and a - out[-1][1] < max_gap and b - out[-1][0] <= max_request:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def check_size(name: str, value: int, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum`` (bytes), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum} (bytes)")
    return value


class _ProcessBlocks:
    """One budget for the blocks every :class:`RemoteRanges` of this process keeps: a reader
    per open file or shard (a sharded version opens many) would otherwise keep its own
    ``keep_bytes`` each. Least recently used first across readers; a reader's evicted block is
    dropped from its ``_kept`` (readers are held weakly: a closed one's blocks just age out).

    Readers of one process may read at once, on threads of the program's own: :attr:`lock`
    orders every change to the budget and to readers' kept blocks, and a read assembles from
    the blocks it took at its start. (A batch across the shards of a sharded version reads its
    shares one after another, their fetches ahead sent at once.)"""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.order: OrderedDict[tuple[int, int], int] = OrderedDict()  # (reader, block) -> size
        self.readers: dict[int, weakref.ref[RemoteRanges]] = {}
        self._lock, self._pid = threading.RLock(), os.getpid()

    @property
    def lock(self) -> threading.RLock:
        """This process's lock: a forked child makes its own (a thread of the parent may have
        held the one it inherited at the fork)."""
        if self._pid != os.getpid():
            self._lock, self._pid = threading.RLock(), os.getpid()
        return self._lock

    def kept(self, reader: RemoteRanges, k: int, blob: bytes) -> None:
        """``reader`` keeps ``blob`` as block ``k``: the least recently used blocks of this
        process's readers go while they hold more than the budget."""
        with self.lock:
            reader._kept[k] = blob
            reader._kept.move_to_end(k)
            while len(reader._kept) * reader.block_bytes > reader.keep_bytes:
                old, _ = reader._kept.popitem(last=False)
                self.held -= self.order.pop((reader._token, old), 0)
            key = (reader._token, k)
            self.held += len(blob) - self.order.pop(key, 0)
            self.order[key] = len(blob)
            if reader._token not in self.readers:
                token = reader._token
                self.readers[token] = weakref.ref(reader, lambda _: self.readers.pop(token, None))
            while self.held > self.budget and len(self.order) > 1:
                (token, old), n = self.order.popitem(last=False)
                self.held -= n
                owner = self.readers.get(token)
                found = owner() if owner is not None else None
                if found is not None:
                    found._kept.pop(old, None)

    def taken(self, reader: RemoteRanges, ks: set[int]) -> dict[int, bytes]:
        """The blocks of ``ks`` that ``reader`` keeps, as they are now (another reader may drop
        them once the lock is released), marked as just used."""
        with self.lock:
            out = {k: reader._kept[k] for k in sorted(ks) if k in reader._kept}
            for k in out:
                reader._kept.move_to_end(k)
                if (reader._token, k) in self.order:
                    self.order.move_to_end((reader._token, k))
            return out


_TOKENS = itertools.count()
#: Blocks kept in memory by all remote readers of this process (a forked worker gets a copy
#: of its parent's, as it gets the readers).
_PROCESS = _ProcessBlocks(PROCESS_KEEP_BYTES)
_PROCESS_STORED = _ProcessBlocks(PROCESS_STORED_KEEP_BYTES)


class RemoteRanges:
    """The remote half of :class:`h5forge.asset.ranges.RangeReader` (see the module docstring).

    Args:
        fetch: fetches ``[starts[i], ends[i])`` concurrently (fsspec ``cat_ranges``).
        size: the file's size (blocks are clipped to it).
        short: raises for a short read ``(offset, wanted, got)``.
        store: blocks kept on local disk (see the module docstring; its ``block_bytes`` is
            then the block size); None: none.
    """

    def __init__(
        self,
        fetch: Fetch,
        size: int,
        short: Callable[[int, int, int], None],
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        max_request: int = DEFAULT_MAX_REQUEST,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        keep_bytes: int = DEFAULT_KEEP_BYTES,
        store: BlockSource | None = None,
    ) -> None:
        self.max_gap = check_size("max_gap", max_gap, 0)
        self.max_request = check_size("max_request", max_request, 1)
        self.block_bytes = check_size(
            "block_bytes", block_bytes if store is None else store.block_bytes, 1
        )
        self.keep_bytes = check_size("keep_bytes", keep_bytes, 0)
        self.stats = ReadStats()
        self._fetch, self._size, self._short = fetch, size, short
        self._kept: OrderedDict[int, bytes] = OrderedDict()  # block number -> its bytes
        self._token = next(_TOKENS)  # this reader's blocks in its budget's order
        self.store = store
        self._budget = _PROCESS if store is None else _PROCESS_STORED
        # Blocks being fetched ahead: block number -> the fetch's future (of each block's run
        # as fetched, and the run's first block).
        self._pending: dict[int, Future[dict[int, tuple[Any, int]]]] = {}
        self._ahead: ThreadPoolExecutor | None = None

    @property
    def size(self) -> int:
        """The file's size."""
        return self._size

    def prefetch(self, starts: list[int], ends: list[int]) -> None:
        """Start fetching, in the background, the blocks a later :meth:`read` of these sorted
        runs will need: the whole blocks it would fetch (with a store, every block the runs
        touch; without, those the runs read at least half of), none already kept, held by the
        store or on their way, at most ``keep_bytes`` of them. :meth:`read` waits for those
        it needs; a failed prefetch is only forgotten (the read fetches the block itself)."""
        self._harvest(wait=())
        B = self.block_bytes
        if self.keep_bytes < B:
            return
        cover: dict[int, int] = {}
        for a, b in zip(starts, ends, strict=True):
            for k in range(a // B, (b - 1) // B + 1):
                cover[k] = cover.get(k, 0) + min(b, (k + 1) * B) - max(a, k * B)
        want = []
        for k, n in sorted(cover.items()):
            lo, hi = k * B, min((k + 1) * B, self._size)
            if k in self._kept or k in self._pending:
                continue
            if self.store is None and 2 * n < hi - lo:
                continue
            if self.store is not None and self.store.has(k):
                continue
            want.append(k)
        want = [k for k in want[: max(1, self.keep_bytes // B)] if self._claim(k)]
        if not want:
            return
        if self._ahead is None:
            self._ahead = ThreadPoolExecutor(1, thread_name_prefix="h5forge-prefetch")
        future = self._ahead.submit(self._fetch_ahead, self._block_runs(want))
        for k in want:
            self._pending[k] = future

    def _fetch_ahead(self, runs: list[list[int]]) -> dict[int, tuple[Any, int]]:
        """The fetch of :meth:`prefetch`, on its thread: each block's run as fetched (its bytes,
        or the exception its request raised) and the run's first block. Each block is kept in
        the store and its claim released as soon as it arrives (a worker waiting for the block
        must not wait for this reader's next batch); written from views of the run, so that
        this thread allocates nothing that its own malloc arena would keep."""
        out: dict[int, tuple[Any, int]] = {}
        try:
            spans = [self._run_span(run) for run in runs]
            blobs = self._fetch([a for a, _ in spans], [b for _, b in spans])
            for run, blob in zip(runs, blobs, strict=True):
                for k in run:
                    out[k] = (blob, run[0])
                    piece = self._block_view(blob, run[0], k)
                    if piece is not None and self.store is not None:
                        self.store.put(k, piece)
        finally:
            if self.store is not None:  # kept, or left to whoever needs them
                for run in runs:
                    for k in run:
                        self.store.release(k)
        return out

    def _harvest(self, wait: Sequence[int]) -> dict[int, bytes]:
        """Prefetched blocks whose fetch is done (and those in ``wait``, waited for): kept;
        returns the ones of ``wait`` that arrived."""
        got: dict[int, bytes] = {}
        for k in [k for k, f in self._pending.items() if f.done() or k in wait]:
            try:
                run, first = self._pending.pop(k).result()[k]
            except Exception:  # forgotten: read() fetches it (and raises what it must)
                continue
            blob = self._block_of(run, first, k)
            if blob is None:
                continue
            self.stats.requests += k == first  # one request for the run's blocks
            self.stats.bytes += len(blob)
            self.stats.stored_puts += self.store is not None
            self._keep(k, blob)
            if k in wait:
                got[k] = blob
        return got

    def _claim(self, k: int) -> bool:
        """Whether this reader fetches block ``k`` to keep in its store: no store, or the
        store's claim on it made here (another process is not fetching it, and it is still
        not kept)."""
        if self.store is None:
            return True
        if not self.store.claim(k):
            return False
        if self.store.has(k):  # kept just before the claim: read from the store
            self.store.release(k)
            return False
        return True

    def read(self, starts: list[int], ends: list[int]) -> list[list[memoryview]]:
        """The bytes of each sorted, non-overlapping run ``[starts[i], ends[i])``, as the views
        of the blocks and fetched spans that hold them, in order: a run over several blocks is
        not joined into a copy of its own (the caller copies each part once, to its place)."""
        B = self.block_bytes
        runs = list(zip(starts, ends, strict=True))
        needed = {k for a, b in runs for k in range(a // B, (b - 1) // B + 1)}
        if self._pending:  # blocks fetched ahead for this batch: waited for, then kept
            self._harvest(sorted(needed))
        kept = self._budget.taken(self, needed)  # as of now: other readers may drop them
        local = self._from_store(runs, kept)  # this batch's blocks read from the store
        held = [
            all(k in kept or k in local for k in range(a // B, (b - 1) // B + 1)) for a, b in runs
        ]
        self.stats.kept_hits += sum(held)
        miss = [i for i, h in enumerate(held) if not h]
        plan = coalesce(
            [starts[i] for i in miss],
            [ends[i] for i in miss],
            max_gap=self.max_gap,
            max_request=self.max_request,
        )
        touched = {k for s, e in plan for k in range(s // B, (e - 1) // B + 1)}
        touched -= kept.keys() | local.keys()
        # With a store, whole blocks while the batch's fit what a reader keeps.
        every = self.store is not None and len(touched) * B <= self.keep_bytes
        whole: set[int] = set()  # fetched here, whole, and kept
        others: set[int] = set()  # being fetched by another process: waited for in the store
        segments: list[tuple[int, int]] = []
        for s, e in plan:
            if self.keep_bytes < B:  # nothing could be kept: read exactly what is asked
                segments.append((s, e))
                continue
            for k in range(s // B, (e - 1) // B + 1):
                lo, hi = k * B, min((k + 1) * B, self._size)
                if k in whole or k in others or k not in touched:
                    continue
                if every or 2 * (min(e, hi) - max(s, lo)) >= hi - lo:
                    (whole if self._claim(k) else others).add(k)
            # What whole, kept or awaited blocks leave of the request (its head and tail).
            seg = s
            for k in range(s // B, (e - 1) // B + 1):
                lo, hi = max(s, k * B), min(e, (k + 1) * B)
                if k in whole or k in others or k in kept or k in local:
                    if seg < lo:
                        segments.append((seg, lo))
                    seg = hi
            if seg < e:
                segments.append((seg, e))
        block_runs = self._block_runs(sorted(whole))
        spans = [self._run_span(run) for run in block_runs] + segments
        fetched: list[tuple[int, int, bytes]] = [
            (k * B, k * B + len(blob), blob) for k, blob in local.items()
        ]
        waited: dict[int, bytes] = {}
        late: list[list[int]] = []  # awaited blocks that did not come: fetched here after all
        try:
            fetched += self._get(spans)
            if others:
                assert self.store is not None
                waited = self.store.wait({k: self._span(k)[1] - k * B for k in sorted(others)})
                self.stats.stored_hits += len(waited)
                fetched += [(k * B, k * B + len(blob), blob) for k, blob in waited.items()]
                late = self._block_runs(sorted(others - waited.keys()))
                fetched += self._get([self._run_span(run) for run in late])
            sent = spans + [self._run_span(run) for run in late]
            if sent:  # bytes fetched beyond the wanted ones they hold
                self.stats.over_read += sum(b - a for a, b in sent) - sum(
                    max(0, min(ends[i], hi) - max(starts[i], lo)) for i in miss for lo, hi in sent
                )
            out = [self._assemble(a, b, fetched, kept) for a, b in runs]
            # Kept after assembling, so an eviction cannot drop a block this batch needs: the
            # runs of whole blocks are the first ``len(block_runs)`` spans fetched, in block
            # order; the late ones the last.
            got = fetched[len(local) :]
            mine = list(zip(block_runs, got, strict=False)) + list(
                zip(late, got[len(got) - len(late) :], strict=True)
            )
            for run, (_, _, blob) in mine:
                for k in run:
                    piece = self._block_of(blob, run[0], k)
                    assert piece is not None  # its length was checked above
                    self._keep(k, piece)
                    if self.store is not None:
                        self.store.put(k, piece)
        finally:
            if self.store is not None:
                for k in whole:
                    self.store.release(k)
        for k, blob in (local | waited).items():
            self._keep(k, blob)
        if self.store is not None:
            self.store.complete(self._fetch)
        return out

    def _get(self, spans: list[tuple[int, int]]) -> list[tuple[int, int, bytes]]:
        """``spans`` fetched at once (one request each), checked and counted, as
        ``(start, end, bytes)``; raises what a failed request raised."""
        if not spans:
            return []
        out = []
        blobs = self._fetch([a for a, _ in spans], [b for _, b in spans])
        for (a, b), blob in zip(spans, blobs, strict=True):
            if isinstance(blob, BaseException):
                raise blob
            if len(blob) != b - a:
                self._short(a, b - a, len(blob))
            self.stats.requests += 1
            self.stats.bytes += len(blob)
            out.append((a, b, blob))
        return out

    def _span(self, k: int) -> tuple[int, int]:
        """Block ``k``'s bytes in the file (the last block is clipped to its size)."""
        return k * self.block_bytes, min((k + 1) * self.block_bytes, self._size)

    def _block_runs(self, ks: list[int]) -> list[list[int]]:
        """Sorted block numbers grouped into runs of adjacent blocks, each at most
        :data:`BLOCK_RUN_BYTES` (and ``max_request``): one request each."""
        most = max(1, min(BLOCK_RUN_BYTES, self.max_request) // self.block_bytes)
        runs: list[list[int]] = []
        for k in ks:
            if runs and runs[-1][-1] == k - 1 and len(runs[-1]) < most:
                runs[-1].append(k)
            else:
                runs.append([k])
        return runs

    def _run_span(self, run: list[int]) -> tuple[int, int]:
        return self._span(run[0])[0], self._span(run[-1])[1]

    def _block_of(self, blob: Any, first: int, k: int) -> bytes | None:
        """Block ``k``'s bytes out of the fetched run that starts at block ``first`` (the run's
        own object when it is that one block); None when the run failed or came back short."""
        view = self._block_view(blob, first, k)
        return None if view is None else bytes(view)

    def _block_view(self, blob: Any, first: int, k: int) -> bytes | memoryview | None:
        """:meth:`_block_of` without a copy: the run itself, or a view of it."""
        B = self.block_bytes
        lo, hi = (k - first) * B, min((k + 1) * B, self._size) - first * B
        if isinstance(blob, BaseException) or len(blob) < hi:
            return None
        if lo == 0 and len(blob) == hi:
            return blob
        return memoryview(blob)[lo:hi]

    def _from_store(self, runs: list[tuple[int, int]], kept: dict[int, bytes]) -> dict[int, bytes]:
        """The blocks of ``runs`` that are not ``kept`` in memory but in the store."""
        if self.store is None:
            return {}
        B, out = self.block_bytes, {}
        for a, b in runs:
            for k in range(a // B, (b - 1) // B + 1):
                if k in kept or k in out:
                    continue
                blob = self.store.get(k, min((k + 1) * B, self._size) - k * B)
                if blob is not None:
                    out[k] = blob
                    self.stats.stored_hits += 1
        return out

    def _assemble(
        self, a: int, b: int, fetched: list[tuple[int, int, bytes]], kept: dict[int, bytes]
    ) -> list[memoryview]:
        """The bytes ``[a, b)`` from ``kept`` blocks and this batch's fetched spans, as views."""
        parts: list[memoryview] = []
        pos = a
        while pos < b:
            k = pos // self.block_bytes
            blob = kept.get(k)
            if blob is not None:
                lo = k * self.block_bytes
                end = min(b, lo + len(blob))
                parts.append(memoryview(blob)[pos - lo : end - lo])
            else:
                found = [f for f in fetched if f[0] <= pos < f[1]]
                if not found:  # the plan covers every run; this would be a bug, never data
                    raise RuntimeError(f"no fetched span holds byte {pos}")
                lo, hi, blob = found[0]
                end = min(b, hi)
                parts.append(memoryview(blob)[pos - lo : end - lo])
            pos = end
        return parts

    def _keep(self, k: int, blob: bytes) -> None:
        self._budget.kept(self, k, blob)

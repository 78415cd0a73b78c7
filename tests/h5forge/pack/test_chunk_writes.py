"""pack.chunk_writes: gathered writes land exactly where each piece was asked to go."""

from __future__ import annotations

import os
import random
from pathlib import Path

from h5forge.pack import chunk_writes
from h5forge.pack.chunk_writes import ChunkWriter


def test_pieces_land_where_asked(tmp_path: Path) -> None:
    """Runs of consecutive pieces, a gap, a piece larger than the gathering limit, a run that
    crosses the limit: the file holds every piece at its offset, and nothing before the flush
    but what was already written."""
    rng = random.Random(3)
    limit = chunk_writes._LIMIT
    path = tmp_path / "f.bin"
    want = bytearray(3 * limit + 4096)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, len(want))
        writer = ChunkWriter(fd)
        at = 100
        for size in [1000] * 5 + [limit + 10] + [limit // 3] * 4:
            piece = rng.randbytes(size)
            writer.write(at, piece)
            want[at : at + size] = piece
            at += size + (7 if size == 1000 and at > 3000 else 0)  # a gap after a few
        writer.flush()
        assert os.pread(fd, len(want), 0) == bytes(want)
        writer.write(0, b"late")
        assert os.pread(fd, 4, 0) == b"\0" * 4  # gathered, not yet written
        writer.flush()
        assert os.pread(fd, 4, 0) == b"late"
    finally:
        os.close(fd)


def test_pieces_are_written_as_given_and_at_most_hold_are_kept(tmp_path: Path) -> None:
    """A piece is written from the very buffer it was given (kept, not copied: a change before
    the write is what lands), and the writer keeps at most HOLD: the next one writes them."""
    hold = chunk_writes.HOLD
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 100 * (hold + 1))
        writer = ChunkWriter(fd)
        pieces = [bytearray([i + 1]) * 100 for i in range(hold + 1)]
        for i, piece in enumerate(pieces[:hold]):
            writer.write(100 * i, memoryview(piece))
        pieces[0][:] = b"\xee" * 100  # still held: this is what the file gets
        assert os.pread(fd, 100 * hold, 0) == bytes(100 * hold)
        writer.write(100 * hold, memoryview(pieces[hold]))  # one more: the HOLD are written
        assert os.pread(fd, 100 * hold, 0) == b"".join(pieces[:hold])
        assert os.pread(fd, 100, 100 * hold) == bytes(100)
        writer.flush()
        assert os.pread(fd, 100 * (hold + 1), 0) == b"".join(pieces)
    finally:
        os.close(fd)

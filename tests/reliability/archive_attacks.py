"""Campaign 4 — archives and paths: every hostile archive is refused, nothing lands outside.

The table is ``tests/fixtures/archives.ATTACKS`` (the storage issue's 25) plus :data:`EXTRA`
below: PAX and GNU long-name traversal, absolute and chained symlinks written through, a folder
replaced by a link, a link replaced by a file, hard links to folders, an encrypted zip member,
a zip symlink to an absolute path, a zip FIFO, a truncated archive and one whose header declares
more bytes than it holds. Each archive goes through ``safe_extract`` directly and through
``fetch`` served by the loopback HTTP server. Requirements: ``UnsafeArchiveError`` whose
message names the member (for the corrupt ones, an ``UnsafeArchiveError`` saying so), the
destination does not exist afterwards, the folder around it is exactly as before (no staging,
incoming or lock left), and no file appeared outside (``/tmp/h5forge-evil.txt``). Issue 11 added
deep members (65 and 1,200 levels, tar and zip), depth reached through an in-archive link, a
chain of 1,500 links, an over-long name component and terminal escape sequences in names; every
message must also be printable (no control character reaches a terminal).
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from h5forge.errors import UnsafeArchiveError
from h5forge.fetch.extract import safe_extract
from h5forge.fetch.sources import fetch
from tests.fixtures.archives import ATTACKS, Attack
from tests.reliability._result import CampaignResult
from tests.reliability._servers import loopback_http

__all__ = ["EXTRA", "TABLE", "run"]

_EVIL = Path("/tmp/h5forge-evil.txt")


def _tar(
    members: list[tuple[str, bytes, dict[str, object]]],
    mode: str = "w",
    fmt: int = tarfile.PAX_FORMAT,
) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        with tarfile.open(path, mode, format=fmt) as tf:  # type: ignore[call-overload]
            for name, data, attrs in members:
                info = tarfile.TarInfo(name)
                info.size = (
                    len(data) if attrs.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
                )
                for key, value in attrs.items():
                    setattr(info, key, value)
                tf.addfile(info, io.BytesIO(data) if info.size else None)

    return build


def _zip(members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Callable[[Path], None]:
    def build(path: Path) -> None:
        with zipfile.ZipFile(path, "w") as zf:
            for info, data in members:
                zf.writestr(info, data)

    return build


def _zinfo(name: str, kind: int, perm: int = 0o777) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (kind | perm) << 16
    return info


def _encrypted_zip(path: Path) -> None:
    _zip([("secret.txt", b"x" * 100)])(path)
    raw = bytearray(path.read_bytes())
    for sig, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        pos = raw.find(sig)
        raw[pos + flag_at] |= 0x01  # general purpose bit 0: encrypted
    path.write_bytes(bytes(raw))


def _truncated_targz(path: Path) -> None:
    _tar([(f"f{i}.bin", os.urandom(20_000), {}) for i in range(4)], "w:gz")(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _short_member(path: Path) -> None:
    """A tar whose header declares 1 MiB for a member the archive holds 512 bytes of."""
    _tar([("short.bin", b"x" * 512, {})], fmt=tarfile.USTAR_FORMAT)(path)
    raw = bytearray(path.read_bytes())
    size = f"{1 << 20:011o}".encode() + b"\x00"
    raw[124:136] = size
    raw[148:156] = b" " * 8
    raw[148:154] = f"{sum(raw[:512]):06o}".encode()
    raw[154:156] = b"\x00 "
    path.write_bytes(bytes(raw[: 512 + 512]))  # header + one data block, no end marker


_REG: dict[str, object] = {"mode": 0o644}
_DEEP_65 = "/".join(["d"] * 64) + "/f.txt"
_HALF = "/".join(["h"] * 40)
_THROUGH = "l/" + "/".join(["e"] * 40) + "/f.txt"
_ESC = "x\x1b]0;pwned\x07\x1b[2J\u202e/../../h5forge-evil.txt"
_SYM = tarfile.SYMTYPE
_LNK = tarfile.LNKTYPE

EXTRA: list[Attack] = [
    Attack(
        "pax-long-path-traversal",
        ".tar",
        _tar([("ok/" + "x" * 120 + "/../../../../h5forge-evil.txt", b"x", _REG)]),
        "ok/" + "x" * 120 + "/../../../../h5forge-evil.txt",
    ),
    Attack(
        "gnu-longname-traversal",
        ".tar",
        _tar([("../" * 40 + "tmp/h5forge-evil.txt", b"x", _REG)], fmt=tarfile.GNU_FORMAT),
        "../" * 40 + "tmp/h5forge-evil.txt",
    ),
    Attack(
        "tar-abs-symlink-write-through",
        ".tar",
        _tar([("t", b"", {"type": _SYM, "linkname": "/tmp"}), ("t/h5forge-evil.txt", b"x", _REG)]),
        "t",
    ),
    Attack(
        "tar-symlink-chain-escape",
        ".tar",
        _tar(
            [
                ("a", b"", {"type": _SYM, "linkname": "b"}),
                ("b", b"", {"type": _SYM, "linkname": "../.."}),
                ("a/h5forge-evil.txt", b"x", _REG),
            ]
        ),
        "b",
    ),
    Attack(
        "tar-dir-replaced-by-escaping-link",
        ".tar",
        _tar(
            [
                ("d", b"", {"type": tarfile.DIRTYPE, "mode": 0o755}),
                ("d", b"", {"type": _SYM, "linkname": "../../.."}),
                ("d/h5forge-evil.txt", b"x", _REG),
            ]
        ),
        "d",
    ),
    Attack(
        "tar-hardlink-to-folder",
        ".tar",
        _tar(
            [
                ("d", b"", {"type": tarfile.DIRTYPE, "mode": 0o755}),
                ("h", b"", {"type": _LNK, "linkname": "d"}),
            ]
        ),
        "h",
    ),
    Attack(
        "tar-hardlink-to-missing",
        ".tar",
        _tar([("h", b"", {"type": _LNK, "linkname": "nowhere"})]),
        "h",
    ),
    Attack(
        "tar-pax-symlink-escape",
        ".tar",
        _tar([("p", b"", {"type": _SYM, "linkname": "/".join([".."] * 30) + "/etc"})]),
        "p",
    ),
    Attack(
        "tar-member-count-bomb-dirs",
        ".tar",
        _tar([(f"d{i:03d}", b"", {"type": tarfile.DIRTYPE, "mode": 0o755}) for i in range(40)]),
        "d010",
        {"max_members": 10},
    ),
    Attack("zip-symlink-absolute", ".zip", _zip([(_zinfo("etc", stat.S_IFLNK), b"/etc")]), "etc"),
    Attack("zip-fifo", ".zip", _zip([(_zinfo("pipe", stat.S_IFIFO, 0o644), b"")]), "pipe"),
    Attack("zip-blockdev", ".zip", _zip([(_zinfo("sda", stat.S_IFBLK, 0o644), b"")]), "sda"),
    Attack("zip-dir-dotdot", ".zip", _zip([("../evil-dir/", b"")]), "../evil-dir/"),
    Attack("zip-encrypted-member", ".zip", _encrypted_zip, "secret.txt"),
    Attack(
        "zip-symlink-then-write-through",
        ".zip",
        _zip([(_zinfo("up", stat.S_IFLNK), b".."), ("up/h5forge-evil.txt", b"x")]),
        "up",
    ),
    Attack("targz-truncated", ".tar.gz", _truncated_targz, ""),
    Attack("tar-header-claims-more-than-it-holds", ".tar", _short_member, "short.bin"),
    # Depth and links (issue 11): refused before any folder of the member is made, and without
    # recursion (a 1,200-deep member used to end in RecursionError).
    Attack("tar-member-65-deep", ".tar", _tar([(_DEEP_65, b"x", _REG)]), _DEEP_65),
    Attack(
        "tar-member-1200-deep", ".tar", _tar([("/".join(["d"] * 1_199) + "/f.txt", b"x", _REG)]), ""
    ),
    Attack("zip-member-1200-deep", ".zip", _zip([("/".join(["d"] * 1_199) + "/f.txt", b"x")]), ""),
    Attack(
        "tar-deep-through-in-archive-link",
        ".tar",
        _tar(
            [
                (_HALF, b"", {"type": tarfile.DIRTYPE, "mode": 0o755}),
                ("l", b"", {"type": _SYM, "linkname": _HALF}),
                (_THROUGH, b"x", _REG),
            ]
        ),
        _THROUGH,
    ),
    Attack(
        "tar-symlink-chain-1500",
        ".tar",
        _tar(
            [
                *((f"l{i}", b"", {"type": _SYM, "linkname": f"l{i + 1}"}) for i in range(1_499)),
                ("l1499", b"", {"type": _SYM, "linkname": "."}),
                ("l0/x", b"x", _REG),
            ]
        ),
        "l0/x",
    ),
    Attack("tar-name-component-over-255-bytes", ".tar", _tar([("a" * 300, b"x", _REG)]), "a" * 300),
    # Terminal escape sequences in a refused member's name: shown escaped (repr-like).
    Attack("tar-escape-sequences-in-name", ".tar", _tar([(_ESC, b"x", _REG)]), _ESC),
    Attack("zip-escape-sequences-in-name", ".zip", _zip([(_ESC, b"x")]), _ESC),
]

TABLE: list[Attack] = [*ATTACKS, *EXTRA]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _check(
    attack: Attack, run_it: Callable[[Path], object], work: Path, how: str, res: CampaignResult
) -> None:
    box = work / f"{how}-{attack.id}"
    shutil.rmtree(box, ignore_errors=True)
    (box / "out").mkdir(parents=True)
    dest = box / "out" / "dest"
    before = _tree(box / "out")
    evil_before = _EVIL.exists()
    problem = None
    try:
        run_it(dest)
        problem = "was ACCEPTED"
    except UnsafeArchiveError as e:
        if attack.member and repr(attack.member) not in str(e):
            problem = f"refused without naming {attack.member!r}: {e}"
        elif not str(e).isprintable():
            problem = f"message holds control characters: {str(e)!r}"
    except Exception as e:  # noqa: BLE001 - any other escape is a finding
        problem = f"raised {type(e).__name__} instead of UnsafeArchiveError: {e}"
    after = _tree(box / "out")
    if after != before:
        problem = (problem or "") + f" left {sorted(set(after) - set(before))}"
    if _EVIL.exists() and not evil_before:
        problem = (problem or "") + f" WROTE {_EVIL}"
        _EVIL.unlink()
    escaped = bool(problem and ("WROTE" in problem or "ACCEPTED" in problem))
    res.record(
        f"{how}: refused" if problem is None else f"{how}: FAILED",
        detected=problem is None,
        lost=escaped,
        problem=None if problem is None else f"{how} {attack.id}: {problem}",
    )
    if problem is None:
        shutil.rmtree(box)


def run(*, work: Path, log: Callable[[str], None] = lambda s: None) -> CampaignResult:
    """Every attack of :data:`TABLE` through ``safe_extract`` and through ``fetch`` over HTTP."""
    t0 = time.perf_counter()
    res = CampaignResult("archives")
    archives = work / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    with loopback_http() as http:
        for attack in TABLE:
            archive = archives / f"{attack.id}{attack.suffix}"
            attack.build(archive)
            _check(
                attack,
                lambda d, a=archive, at=attack: safe_extract(a, d, **at.caps),
                work,
                "safe_extract",
                res,
            )
            url = http.serve(f"/{archive.name}", archive.read_bytes())
            caps = dict(attack.caps)
            _check(
                attack,
                lambda d, u=url, c=caps: fetch(
                    u, d, cache_dir=d.parent.parent / "cache", retries=0, timeout=10, **c
                ),
                work,
                "fetch over HTTP",
                res,
            )
    # The fetch cache keeps the (refused) downloads; it sits outside the checked folder.
    shutil.rmtree(archives, ignore_errors=True)
    res.notes.append(
        f"{len(ATTACKS)} attacks from tests/fixtures/archives.py + {len(EXTRA)} "
        "here, each through safe_extract and through fetch over HTTP"
    )
    res.seconds = time.perf_counter() - t0
    log(f"  {len(TABLE)} archives, {res.trials} checks")
    return res

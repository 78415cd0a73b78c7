"""Campaign 3 — hostile and odd input: a corpus of awkward files and folders, and fuzzing.

:func:`write_hostile_corpus` writes one ImageFolder holding every kind of awkward input
(``h5forge.demo.write_bad_files``'s 14 and 20 more: HTML and random bytes under image
extensions, YCCK JPEG, every EXIF orientation, decompression-bomb headers in three formats, a
PNG text-chunk bomb, odd modes, 1x1 and very elongated images, unicode, spaces and newlines in
file and class names, deep nesting, symlinks to files and folders, symlink loops, broken links,
a FIFO, duplicate files, hidden and non-image files, links out of the root) and says what must
happen to each: packed (pixels checked against an independent Pillow decode where that is
meaningful), quarantined with a reason of a given kind, or skipped by discovery for a given
reason. An empty class folder is a separate tree: ``h5forge pack`` must refuse it with a clear
``EmptyDatasetError`` (exit 2), because packing it would either invent a class with no samples
or silently drop one.

Listings (issue 11): :data:`LISTING_ATTACKS` go through ``discover`` (huge and 1,000-digit
labels, 128 KB fields, 2 MiB lines, NUL, UTF-16 and Latin-1 bytes, wrong column counts, empty
paths, bad and deeply nested JSON, absolute and ``..`` paths, links out, a link to a link out,
a folder link out, a link loop, a FIFO, a device, escape sequences) and must be refused with
a short printable message naming the listing and line, or, for the odd but valid ones,
accepted; two go through ``h5forge pack --listing`` (exit 2, one line, nothing written). A
1,200-deep folder tree must be cut at the depth limit, not crash discovery.

``h5forge pack`` runs as a subprocess on the corpus (decoded at source size, and the default
224x224 shorter-side resize); it must exit 0 with no "Traceback" in its output, and the file must
hold exactly the expected packed and quarantined paths. Then hypothesis fuzzes ``discover``
(random trees of random names) and ``process_file`` (random bytes, and valid images of several
formats with random byte flips and truncations): ``discover`` returns a consistent catalog or one
of its documented errors; ``process_file`` always returns ``Processed`` (with bytes matching its
shape) or ``Quarantined`` (with a reason of a documented kind), never raises.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from h5forge.demo import synth_photo, write_bad_files
from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import EmptyDatasetError
from h5forge.files import remove_tree
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.images import Processed, Quarantined, process_file
from tests.fixtures.images import EXPECTED_OUTCOME
from tests.fixtures.trees import deep_chain
from tests.reliability._procs import REPO
from tests.reliability._result import CampaignResult

__all__ = [
    "LISTING_ATTACKS",
    "Expect",
    "ListingAttack",
    "deep_local_tree",
    "fuzz_discover",
    "fuzz_process_file",
    "listing_attacks",
    "listing_pack",
    "run",
    "run_pack",
    "write_hostile_corpus",
]

REASON_KINDS = (
    "zero-byte file",
    "unreadable",
    "not an image",
    "image too large",
    "truncated image",
    "corrupt image",
    "unsupported image",
)


@dataclass(frozen=True)
class Expect:
    """What must happen to one corpus entry.

    Attributes:
        kind: the kind of awkward input.
        outcome: ``"packed"``, ``"quarantined"`` or ``"skipped"``.
        detail: reason prefix (quarantined), ``Catalog.skipped`` key (skipped), or ``""``.
        reference: for packed entries whose pixels can be predicted: a function returning the
            expected ``(H, W, C)`` RGB array at source size.
    """

    kind: str
    outcome: str
    detail: str = ""
    reference: Callable[[], np.ndarray] | None = None


def _jpeg(img: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=92, **kw)
    return buf.getvalue()


def _png(img: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG", **kw)
    return buf.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (
        struct.pack(">I", len(body))
        + kind
        + body
        + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    )


def _ycck(photo: Image.Image) -> bytes:
    """A CMYK JPEG whose Adobe marker says YCCK (transform 2): decoders convert YCCK->CMYK."""
    data = bytearray(_jpeg(photo.convert("CMYK")))
    at = data.find(b"Adobe")
    assert at >= 4, "Pillow wrote no Adobe marker"
    assert data[at - 4 : at - 2] == b"\xff\xee", "Pillow wrote no Adobe marker"
    data[at + 11] = 2  # "Adobe", version (2 bytes), flags0 (2), flags1 (2), then the transform
    return bytes(data)


def _gif_bomb() -> bytes:
    """A GIF whose logical screen and frame claim 60000 x 60000 pixels."""
    header = b"GIF89a" + struct.pack("<HHBBB", 60000, 60000, 0, 0, 0)
    frame = b"," + struct.pack("<HHHHB", 0, 0, 60000, 60000, 0) + b"\x02\x02\x4c\x01\x00;"
    return header + frame


def _png_text_bomb(photo: Image.Image) -> bytes:
    """A valid small PNG with a zTXt chunk that inflates to 64 MiB (Pillow's text cap is 1 MiB)."""
    png = _png(photo)
    ztxt = _chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"\0" * (64 << 20), 9))
    return png[:33] + ztxt + png[33:]


def _exif(photo: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    photo.save(buf, "JPEG", quality=95, exif=exif)
    return buf.getvalue()


def _decoded(data: bytes) -> Callable[[], np.ndarray]:
    """The reference pixels: Pillow's own decode, EXIF transposed, flattened onto white."""

    def ref() -> np.ndarray:
        img = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
        if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
            rgba = img.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            img = Image.alpha_composite(white, rgba)
        return np.asarray(img.convert("RGB"))

    return ref


def write_hostile_corpus(root: Path) -> dict[str, Expect]:
    """Write the corpus under ``root`` (ImageFolder); returns relative path -> expectation.

    Relative paths are those the packed file records. Entries discovery skips are listed under
    the path they would have had.
    """
    rng = np.random.default_rng(99)
    photo = synth_photo(rng, 36, 52)
    out: dict[str, Expect] = {}

    def put(rel: str, data: bytes, expect: Expect) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        out[rel] = expect

    # 1. The 14 kinds of h5forge.demo.write_bad_files, in class "bad".
    tmp = root / ".bad-staging"
    for name, kind in write_bad_files(tmp).items():
        want = EXPECTED_OUTCOME[kind]
        data = (tmp / name).read_bytes()
        checkable = kind in (
            "exif-orientation-6",
            "exif-orientation-8",
            "tiny-1x1",
            "elongated-1x2000",
            "palette-transparency",
        )
        expect = (
            Expect(kind, "packed", "", _decoded(data) if checkable else None)
            if want == "ok"
            else Expect(kind, "quarantined", want)
        )
        put(f"bad/{name}", data, expect)
    shutil.rmtree(tmp)

    # 2. Formats and modes.
    put(
        "odd/html-page.png",
        b"<html><head><title>Moved</title></head><body></body></html>\n",
        Expect("html-as-png", "quarantined", "not an image"),
    )
    put(
        "odd/random.webp",
        rng.bytes(4096),
        Expect("random-bytes-webp", "quarantined", "not an image"),
    )
    put("odd/ycck.jpg", _ycck(photo), Expect("ycck-jpeg", "packed"))
    put(
        "odd/gif-bomb.gif", _gif_bomb(), Expect("gif-bomb-header", "quarantined", "image too large")
    )
    put(
        "odd/text-bomb.png",
        _png_text_bomb(photo),
        Expect("png-ztxt-bomb", "quarantined", "corrupt image"),
    )
    tiny_wide = _png(synth_photo(rng, 1, 3000))
    put(
        "odd/strip-3000x1.png",
        tiny_wide,
        Expect("elongated-3000x1", "packed", "", _decoded(tiny_wide)),
    )
    la = photo.convert("LA")
    put("odd/gray-alpha.png", _png(la), Expect("la-png", "packed", "", _decoded(_png(la))))
    f32 = Image.fromarray(np.linspace(-50, 400, 36 * 52, dtype=np.float32).reshape(36, 52))
    buf = io.BytesIO()
    f32.save(buf, "TIFF")
    put("odd/float32.tif", buf.getvalue(), Expect("float32-tiff", "packed"))
    multi = io.BytesIO()
    photo.save(multi, "TIFF", save_all=True, append_images=[photo.rotate(90, expand=True)])
    put(
        "odd/two-pages.tif",
        multi.getvalue(),
        Expect("multi-page-tiff", "packed", "", _decoded(multi.getvalue())),
    )
    webp = io.BytesIO()
    photo.save(webp, "WEBP", quality=80)
    put(
        "odd/truncated.webp",
        webp.getvalue()[: len(webp.getvalue()) // 2],
        Expect("truncated-webp", "quarantined", "corrupt image"),
    )  # libwebp cannot tell
    put(
        "odd/photo.bmp",
        _bmp := (lambda: (b := io.BytesIO(), photo.save(b, "BMP"), b.getvalue())[2])(),
        Expect("bmp", "packed", "", _decoded(_bmp)),
    )
    ppm = io.BytesIO()
    photo.save(ppm, "PPM")
    put("odd/photo.ppm", ppm.getvalue(), Expect("ppm", "packed", "", _decoded(ppm.getvalue())))

    # 3. Every EXIF orientation, 1-8 (2-5 and 7 beyond write_bad_files' 6 and 8).
    for o in range(1, 9):
        data = _exif(photo, o)
        put(
            f"exif/orientation-{o}.jpg",
            data,
            Expect(f"exif-orientation-{o}", "packed", "", _decoded(data)),
        )

    # 4. Names: unicode, spaces, newlines, in files and classes; deep nesting; duplicates.
    good = _png(photo)
    put(
        "café 日本/naïve ümlaut 🐱.png", good, Expect("unicode-names", "packed", "", _decoded(good))
    )
    put("odd/with space .png", good, Expect("space-in-name", "packed"))
    put("odd/line\nbreak.png", good, Expect("newline-in-file-name", "packed"))
    put("class\nwith newline/x.png", good, Expect("newline-in-class-name", "packed"))
    deep = "/".join(f"d{i}" for i in range(40))
    put(f"odd/{deep}/deep.png", good, Expect("nesting-40-deep", "packed"))
    put("odd/duplicate-a.png", good, Expect("duplicate-file", "packed"))
    put("odd/duplicate-b.png", good, Expect("duplicate-file", "packed"))

    # 5. Links and special files.
    links = root / "links"
    links.mkdir()
    (links / "target.png").write_bytes(good)
    out["links/target.png"] = Expect("link-target", "packed")
    os.symlink("target.png", links / "file-link.png")
    out["links/file-link.png"] = Expect("symlink-to-file", "packed")
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "inside.png").write_bytes(good)
    out["elsewhere/inside.png"] = Expect("symlinked-folder-target", "packed")
    os.symlink("../elsewhere", links / "dir-link")
    out["links/dir-link/inside.png"] = Expect("symlink-to-folder", "packed")
    os.symlink("..", links / "loop")
    out["links/loop"] = Expect("symlink-loop", "skipped", "revisited-folder")
    os.symlink("no-such-file.png", links / "broken.png")
    out["links/broken.png"] = Expect("broken-symlink", "skipped", "broken-link-or-special-file")
    os.mkfifo(links / "fifo.png")
    out["links/fifo.png"] = Expect("fifo", "skipped", "broken-link-or-special-file")
    (links / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    out["links/.DS_Store"] = Expect("hidden-file", "skipped", "hidden")
    (links / "README.txt").write_text("not an image")
    out["links/README.txt"] = Expect("non-image-extension", "skipped", "not-an-image-extension")

    # 6. Links out of the root (issue 11): never followed, whatever they point at.
    outside = root.parent / f"{root.name}-outside"
    shutil.rmtree(outside, ignore_errors=True)
    outside.mkdir()
    (outside / "secret.png").write_bytes(good)
    os.symlink(outside / "secret.png", links / "leak.png")
    out["links/leak.png"] = Expect("symlink-to-file-outside-root", "skipped", "link-outside-root")
    os.symlink("leak.png", links / "leak-via-link.png")
    out["links/leak-via-link.png"] = Expect(
        "symlink-to-symlink-outside-root", "skipped", "link-outside-root"
    )
    os.symlink(outside, links / "outside-dir")
    out["links/outside-dir/secret.png"] = Expect(
        "symlink-to-folder-outside-root", "skipped", "link-outside-root"
    )
    os.symlink(outside, root / "outside-class")
    out["outside-class/secret.png"] = Expect(
        "class-folder-linked-outside-root", "skipped", "link-outside-root"
    )
    return out


def run_pack(root: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``h5forge pack ROOT OUT EXTRA...`` as a subprocess (the console script's module)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "h5forge.deployments.cli",
            "pack",
            str(root),
            str(out),
            "--workers",
            "2",
            "--max-bad-fraction",
            "1",
            *extra,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )


def _check_packed(
    out: Path, corpus: dict[str, Expect], res: CampaignResult, check_pixels: bool, label: str
) -> None:
    with h5py.File(out, "r") as h5:
        paths = h5["paths"].asstr()[()].tolist()
        qpaths = h5["quarantine/paths"].asstr()[()].tolist()
        reasons = dict(zip(qpaths, h5["quarantine/reasons"].asstr()[()].tolist(), strict=True))
        ranges = h5["byte_ranges"][()]
        shapes = h5["shapes"][()] if "shapes" in h5 else None
    row = {p: i for i, p in enumerate(paths)}
    expected = {p for p, e in corpus.items() if e.outcome != "skipped"}
    for extra in sorted((set(paths) | set(qpaths)) - expected):
        res.record(
            f"{label}: unexpected entry",
            detected=False,
            problem=f"{label}: {extra!r} was packed or quarantined but is not in the corpus",
        )
    for rel, e in corpus.items():
        where = f"{label}: {e.kind} ({rel!r})"
        if e.outcome == "skipped":
            ok = rel not in row and rel not in reasons
            res.record(
                f"{e.kind}: skipped ({e.detail})" if ok else f"{e.kind}: NOT SKIPPED",
                detected=ok,
                problem=None if ok else f"{where} should have been skipped",
            )
        elif e.outcome == "quarantined":
            reason = reasons.get(rel, "")
            ok = reason.startswith(e.detail)
            res.record(
                f"{e.kind}: quarantined ({e.detail})" if ok else f"{e.kind}: WRONG",
                detected=ok,
                lost=rel in row,
                problem=None
                if ok
                else f"{where}: expected quarantine '{e.detail}...', "
                f"got {'packed' if rel in row else repr(reason)}",
            )
        elif rel not in row:
            res.record(
                f"{e.kind}: NOT PACKED",
                detected=False,
                lost=True,
                problem=f"{where}: expected packed, got {reasons.get(rel, 'missing')!r}",
            )
        elif check_pixels and e.reference is not None:
            i = row[rel]
            with open(out, "rb") as f:
                f.seek(int(ranges[i, 0]))
                got = np.frombuffer(f.read(int(ranges[i, 1])), np.uint8)
            want = e.reference()
            ok = (
                shapes is not None
                and tuple(shapes[i]) == want.shape
                and np.array_equal(got.reshape(want.shape), want)
            )
            res.record(
                f"{e.kind}: packed, pixels checked" if ok else f"{e.kind}: WRONG PIXELS",
                detected=ok,
                lost=not ok,
                problem=None
                if ok
                else f"{where}: stored pixels differ from Pillow's "
                f"EXIF-transposed decode {want.shape}",
            )
        else:
            res.record(f"{e.kind}: packed", detected=True)


# --------------------------------------------------------------------------- listings

_FIELD = "x" * (128 * 1024)


@dataclass(frozen=True)
class ListingAttack:
    """One hostile listing: its name and bytes, and what ``discover`` must say.

    ``expect`` is a fragment of the message (``None``: the listing is valid and must be
    accepted); the message must also name the listing and ``line``, be one printable line
    and stay short.
    """

    kind: str
    name: str
    data: bytes
    line: int
    expect: str | None


def _m(
    kind: str, text: str | bytes, line: int, expect: str | None, name: str = "m.csv"
) -> ListingAttack:
    return ListingAttack(kind, name, text.encode() if isinstance(text, str) else text, line, expect)


LISTING_ATTACKS: list[ListingAttack] = [
    _m(
        "huge-integer-label-csv",
        "path,label\na.png,0\nb.png,1099511627776\n",
        3,
        "label 1099511627776 is out of range",
    ),
    _m(
        "huge-integer-label-jsonl",
        '{"path": "a.png", "label": 1099511627776}\n',
        1,
        "is out of range",
        "m.jsonl",
    ),
    _m("1000-digit-label", "path,label\na.png," + "9" * 1000 + "\n", 2, "is out of range"),
    _m(
        "5000-digit-json-number",
        '{"path": "a.png", "label": ' + "9" * 5000 + "}\n",
        1,
        "row is not JSON (ValueError",
        "m.jsonl",
    ),
    _m("128k-csv-field-label", f"path,label\na.png,{_FIELD}\n", 2, "label is 131,072 characters"),
    _m(
        "over-csv-field-limit",
        f"path,label\na.png,{_FIELD}y\n",
        2,
        "a field is longer than 131,072 characters",
    ),
    _m(
        "unclosed-quote", f'path,label\na.png,a\n"{_FIELD}\n{_FIELD}\n', 3, "a field is longer than"
    ),
    _m(
        "2-mib-line",
        '{"path": "' + "a" * (2 << 20) + '", "label": 0}\n',
        1,
        "line is longer than",
        "m.jsonl",
    ),
    _m("nul-byte-csv", b"path,label\na.png,a\x00b\n", 2, "NUL byte at column 8"),
    _m("nul-byte-jsonl", b'{"path": "a\x00.png", "label": 0}\n', 1, "NUL byte", "m.jsonl"),
    _m("utf16-listing", "path,label\na.png,a\n".encode("utf-16"), 1, "NUL byte"),
    _m("latin1-bytes", b"path,label\na.png,caf\xe9\n", 2, "byte 0xe9 at column 10 is not UTF-8"),
    _m("too-many-columns", "path,label\na.png,a,b\n", 2, "3 fields, but the header has 2"),
    _m("too-few-columns", "path,label,split\na.png,a\n", 2, "2 fields, but the header has 3"),
    _m("empty-path", "path,label\n,a\n", 2, "empty path"),
    _m("bad-json", '{"path": "a.png", "label": 0}\n{"path": \n', 2, "not JSON", "m.jsonl"),
    _m("deeply-nested-json", "[" * 100_000 + "\n", 1, "nests more than 32 levels", "m.jsonl"),
    _m("absolute-path", "path,label\n/etc/passwd,a\n", 2, "must be relative"),
    _m("dotdot-out", "path,label\nsub/../../secret.png,a\n", 2, "stay inside"),
    _m("symlink-out", "path,label\nleak.png,a\n", 2, "outside the listing's folder"),
    _m("symlink-to-symlink-out", "path,label\nhop.png,a\n", 2, "outside the listing's folder"),
    _m("folder-symlink-out", "path,label\nup/secret.png,a\n", 2, "outside the listing's folder"),
    _m("symlink-loop", "path,label\nloop.png,a\n", 2, "more than 40 symbolic links"),
    _m("fifo", "path,label\npipe.png,a\n", 2, "is a FIFO (named pipe), not a regular file"),
    _m("device-via-link", "path,label\nzero.png,a\n", 2, "outside the listing's folder"),
    _m(
        "escape-sequences-in-path",
        "path,label\nx\x1b[2J\x1b]0;pwned\x07.png,a\n",
        2,
        "'x\\x1b[2J\\x1b]0;pwned\\x07.png' not found",
    ),
    _m(
        "escape-sequences-in-split",
        "path,label,split\na.png,a,\x1b[31m\n",
        2,
        "split '\\x1b[31m' is not one of",
    ),
    # Valid listings that look odd: accepted.
    _m("dotdot-that-comes-back", "path,label\nsub/../a.png,a\n", 0, None),
    _m("bom-and-crlf", b"\xef\xbb\xbfpath,label\r\na.png,a\r\n", 0, None),
    _m("quoted-newlines-in-label", 'path,label\na.png,"two\nlines"\n', 0, None),
    _m("integer-labels-up-to-the-floor", "path,label\na.png,1023\n", 0, None),
]


def _listing_folder(folder: Path) -> None:
    """The images and links every listing attack refers to."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "sub").mkdir(parents=True)
    (folder / "a.png").write_bytes(_png(Image.new("RGB", (4, 4))))
    secret = folder.parent / f"{folder.name}-secret.png"
    secret.write_bytes(b"not yours")
    os.symlink(secret, folder / "leak.png")
    os.symlink("leak.png", folder / "hop.png")
    os.symlink(folder.parent, folder / "up")
    os.symlink("loop.png", folder / "loop.png")
    os.symlink("/dev/zero", folder / "zero.png")
    os.mkfifo(folder / "pipe.png")


def listing_attacks(work: Path, res: CampaignResult) -> None:
    """Every :data:`LISTING_ATTACKS` entry through ``discover`` in this process."""
    folder = work / "listings"
    _listing_folder(folder)
    for attack in LISTING_ATTACKS:
        path = folder / attack.name
        path.write_bytes(attack.data)
        problem = None
        try:
            cat = discover(folder, listing=attack.name)
            if attack.expect is not None:
                problem = f"ACCEPTED ({len(cat.samples)} samples, {len(cat.classes)} classes)"
        except (ValueError, FileNotFoundError) as e:
            text = str(e)
            if attack.expect is None:
                problem = f"refused a valid listing: {text}"
            elif f"{path}:{attack.line}: " not in text:
                problem = f"does not name {path.name}:{attack.line}: {text[:300]}"
            elif attack.expect not in text:
                problem = f"message lacks {attack.expect!r}: {text[:300]}"
            elif not text.isprintable() or len(text) > 2_000:
                problem = f"message not one short printable line: {text[:300]!r}"
        except Exception as e:  # noqa: BLE001 - any other escape is a finding
            problem = f"raised {type(e).__name__}: {str(e)[:300]}"
        path.unlink()
        verdict = "accepted" if attack.expect is None else "refused, file:line named"
        res.record(
            f"listing {attack.kind}: {verdict}"
            if problem is None
            else f"listing {attack.kind}: FAILED",
            detected=problem is None,
            lost=bool(problem and "ACCEPTED" in problem),
            problem=None if problem is None else f"listing {attack.kind}: {problem}",
        )


def listing_pack(work: Path, res: CampaignResult) -> None:
    """``h5forge pack --listing``: a link out and escape sequences end in exit 2, one line."""
    folder = work / "listings"
    _listing_folder(folder)
    for kind, body in (
        ("symlink-out", "path,label\na.png,a\nleak.png,b\n"),
        ("escape-sequences", "path,label\na.png,a\n\x1b[2J\x1b]0;x\x07.png,b\n"),
    ):
        (folder / "m.csv").write_text(body)
        out = work / f"listing-{kind}.h5"
        proc = run_pack(folder, out, "--listing", str(folder / "m.csv"))
        text = proc.stdout + proc.stderr
        ok = (
            proc.returncode == 2
            and "Traceback" not in text
            and "\x1b" not in text
            and f"{folder / 'm.csv'}:3: " in text
            and not out.exists()
        )
        res.record(
            f"pack --listing {kind}: exit 2, file:line, escaped"
            if ok
            else f"pack --listing {kind}: WRONG",
            detected=ok,
            lost=out.exists(),
            problem=None
            if ok
            else f"pack --listing {kind}: exit {proc.returncode}: {text[-800:]!r}",
        )


def deep_local_tree(work: Path, res: CampaignResult) -> None:
    """``discover`` on an ImageFolder whose class holds a 1,200-deep chain of folders."""
    root = work / "deep-tree"
    if root.exists():
        remove_tree(root)
    (root / "a").mkdir(parents=True)
    (root / "a" / "top.png").write_bytes(_png(Image.new("RGB", (4, 4))))
    deep_chain(root / "a", 1_200)
    try:
        cat = discover(root)
        ok = [s.relpath for s in cat.samples] == ["a/top.png"] and cat.skipped.get(
            "folder-too-deep"
        ) == 1
        problem = None if ok else f"deep tree: samples {len(cat.samples)}, skipped {cat.skipped}"
    except Exception as e:  # noqa: BLE001 - RecursionError was the finding
        problem = f"deep tree: discover raised {type(e).__name__}: {str(e)[:200]}"
    finally:
        remove_tree(root)
    res.record(
        "1,200-deep folder tree: skipped (folder-too-deep)"
        if problem is None
        else "1,200-deep folder tree: FAILED",
        detected=problem is None,
        problem=problem,
    )


# --------------------------------------------------------------------------- fuzzing

_NAME = st.text(
    st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1, max_size=12
).filter(lambda s: s not in (".", ".."))
_EXT = st.sampled_from([".jpg", ".png", ".txt", ".JPG", ".webp", "", ".gif"])


def fuzz_discover(work: Path, examples: int, res: CampaignResult) -> None:
    """Random trees (names, nesting, split folders, non-images) through ``discover``."""
    counter = iter(range(10**9))

    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        st.lists(
            st.tuples(
                st.lists(
                    st.one_of(_NAME, st.sampled_from(["train", "val", "test", ".hidden"])),
                    min_size=1,
                    max_size=4,
                ),
                _NAME,
                _EXT,
                st.binary(max_size=8),
            ),
            max_size=12,
        ),
        st.booleans(),
    )
    def check(entries: list[tuple[list[str], str, str, bytes]], empty_class: bool) -> None:
        root = work / f"fuzz-discover-{next(counter)}"
        root.mkdir()
        try:
            for folders, stem, ext, data in entries:
                folder = root.joinpath(*folders)
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / (stem + ext)).write_bytes(data)
                except (FileExistsError, NotADirectoryError, IsADirectoryError, OSError):
                    continue  # a name clash between a file and a folder: not a tree
            if empty_class:
                (root / "zz-empty").mkdir(exist_ok=True)
            try:
                cat = discover(root)
            except (EmptyDatasetError, ValueError) as e:
                res.record(f"discover fuzz: {type(e).__name__}", detected=True)
                return
            problems = _catalog_problems(cat)
            res.record(
                "discover fuzz: catalog",
                detected=not problems,
                problem="; ".join(problems) if problems else None,
            )
        finally:
            shutil.rmtree(root)

    _run_given(check, res, "discover fuzz")


def _catalog_problems(cat: Catalog) -> list[str]:
    problems = []
    if list(cat.classes) != sorted(cat.classes) or len(set(cat.classes)) != len(cat.classes):
        problems.append(f"classes not sorted and unique: {cat.classes}")
    rels = [s.relpath for s in cat.samples]
    if len(set(rels)) != len(rels):
        problems.append("duplicate relpaths")
    for s in cat.samples:
        if not 0 <= s.label < len(cat.classes):
            problems.append(f"label {s.label} out of range for {s.relpath!r}")
        if not os.path.isfile(s.path):
            problems.append(f"{s.path!r} is not a file")
        if s.split and not s.relpath.startswith(s.split + "/"):
            problems.append(f"{s.relpath!r} not under split {s.split!r}")
    present = {s.label for s in cat.samples}
    if present != set(range(len(cat.classes))):
        problems.append("a class without samples")
    return problems


def _seeds() -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    photo = synth_photo(rng, 20, 28)
    out = {}
    for fmt in ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF"):
        buf = io.BytesIO()
        photo.save(buf, fmt)
        out[fmt] = buf.getvalue()
    out["PNG-P-transparency"] = _png(photo.quantize(8), transparency=0)
    out["JPEG-CMYK"] = _jpeg(photo.convert("CMYK"))
    return out


def fuzz_process_file(work: Path, examples: int, res: CampaignResult) -> None:
    """Random bytes and damaged real images through ``process_file``, two configurations."""
    seeds = _seeds()
    path = work / "fuzz-input.img"
    cfgs = (
        ImageConfig(resize="shorter-side", size=(16, 16)),
        ImageConfig(layout="encoded", encoding="png", resize="resize", size=(12, 20)),
    )

    @settings(
        max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        st.one_of(
            st.binary(max_size=512).map(lambda b: ("random", b)),
            st.tuples(
                st.sampled_from(sorted(seeds)),
                st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=6),
                st.floats(0.05, 1.0),
            ).map(lambda t: (t[0], _damage(seeds[t[0]], t[1], t[2]))),
        ),
        st.sampled_from([0, 1]),
    )
    def check(sample: tuple[str, bytes], which: int) -> None:
        kind, data = sample
        path.write_bytes(data)
        try:
            # Pillow warns on some damaged headers ("Truncated File Read", "Corrupt EXIF"):
            # noted, not raised (pytest turns warnings into errors; production prints them).
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                r = process_file(0, str(path), cfgs[which])
            for w in caught:
                key = f"Pillow warning: {w.category.__name__}: {str(w.message)[:40]}"
                res.outcomes[key] += 0  # listed in the breakdown, not counted as a trial
                warned.add(key)
        except Exception as e:  # noqa: BLE001 - the requirement: nothing escapes
            res.record(
                f"process_file fuzz: RAISED {type(e).__name__}",
                detected=False,
                problem=f"process_file raised {type(e).__name__}: {e} on {kind} "
                f"({len(data)} bytes)",
            )
            return
        if isinstance(r, Quarantined):
            ok = r.reason.startswith(REASON_KINDS)
            res.record(
                f"process_file fuzz: quarantined ({r.reason.split(':')[0]})"
                if ok
                else "process_file fuzz: BAD REASON",
                detected=ok,
                problem=None if ok else f"undocumented reason {r.reason!r}",
            )
            return
        assert isinstance(r, Processed)
        h, w, c = r.shape
        ok = (len(r.data) == h * w * c) if which == 0 else r.data[:8] == b"\x89PNG\r\n\x1a\n"
        ok = ok and (h, w) == cfgs[which].size
        res.record(
            "process_file fuzz: processed",
            detected=ok,
            problem=None if ok else f"{kind}: processed output inconsistent: {r.shape}",
        )

    warned: set[str] = set()
    _run_given(check, res, "process_file fuzz")
    if warned:
        res.notes.append(
            "process_file fuzz: Pillow warnings seen (not errors): " + "; ".join(sorted(warned))
        )


def _damage(data: bytes, flips: list[tuple[int, int]], keep: float) -> bytes:
    out = bytearray(data[: max(1, int(len(data) * keep))])
    for pos, mask in flips:
        out[pos % len(out)] ^= mask
    return bytes(out)


def _run_given(check: Callable[[], None], res: CampaignResult, label: str) -> None:
    try:
        check()
    except Exception as e:  # noqa: BLE001 - a falsifying example is reported, not raised
        res.record(
            f"{label}: HARNESS ERROR", detected=False, problem=f"{label}: {type(e).__name__}: {e}"
        )


# --------------------------------------------------------------------------- campaign


def run(
    *,
    fuzz_examples: int = 300,
    work: Path,
    full: bool = True,
    log: Callable[[str], None] = lambda s: None,
) -> CampaignResult:
    """Pack the corpus (one or two configurations), check the empty-class refusal, fuzz."""
    t0 = time.perf_counter()
    res = CampaignResult("hostile")
    root = work / "corpus"
    shutil.rmtree(root, ignore_errors=True)
    corpus = write_hostile_corpus(root)
    kinds = {e.kind for e in corpus.values()}
    res.notes.append(f"corpus: {len(corpus)} entries of {len(kinds)} kinds")
    configs = [("source size", ("--resize", "none", "--size", "none"), True)]
    if full:
        configs.append(("224 shorter-side", (), False))
    for label, args, pixels in configs:
        out = work / f"corpus-{len(label)}.h5"
        proc = run_pack(root, out, "--overwrite", *args)
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 or "Traceback" in text:
            res.record(
                f"pack ({label}): FAILED",
                detected=False,
                problem=f"h5forge pack ({label}) exit {proc.returncode}:\n{text[-2000:]}",
            )
            continue
        _check_packed(out, corpus, res, pixels, label)
        log(f"  pack ({label}): exit 0, no traceback")
    empty = work / "empty-class"
    shutil.rmtree(empty, ignore_errors=True)
    (empty / "a").mkdir(parents=True)
    (empty / "a" / "x.png").write_bytes(_png(Image.new("RGB", (4, 4))))
    (empty / "b").mkdir()
    proc = run_pack(empty, work / "empty.h5")
    text = proc.stdout + proc.stderr
    ok = proc.returncode == 2 and "holds no image file" in text and "Traceback" not in text
    res.record(
        "empty class folder: EmptyDatasetError, exit 2" if ok else "empty class: WRONG",
        detected=ok,
        problem=None if ok else f"empty class folder: exit {proc.returncode}: {text[-1000:]}",
    )
    listing_attacks(work, res)
    log(f"  listings: {len(LISTING_ATTACKS)} attacks through discover")
    listing_pack(work, res)
    deep_local_tree(work, res)
    fuzz_discover(work, fuzz_examples, res)
    log(f"  discover fuzz: {fuzz_examples} examples")
    fuzz_process_file(work, fuzz_examples, res)
    log(f"  process_file fuzz: {fuzz_examples} examples")
    res.seconds = time.perf_counter() - t0
    return res

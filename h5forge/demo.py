"""Deterministic synthetic images: the built-in demo dataset, test fixtures and benchmarks.

Everything here is a pure function of its arguments (seeded ``numpy.random.Generator``), so the
same call writes byte-identical files on every run with the same Pillow/libjpeg/zlib.
"""

from __future__ import annotations

import gzip
import io
import os
import secrets
import struct
import tarfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from h5forge.discover.catalog import SPLIT_NAMES
from h5forge.files import create_exclusive

__all__ = [
    "DEMO_ARCHIVE_NAME",
    "make_demo_archive",
    "synth_photo",
    "write_bad_files",
    "write_image_folder",
]

DEMO_ARCHIVE_NAME = "h5forge-demo.tar.gz"
Size = tuple[int, int] | tuple[tuple[int, int], tuple[int, int]]

_FORMATS = {
    "jpeg": ("JPEG", ".jpg"),
    "png": ("PNG", ".png"),
    "webp": ("WEBP", ".webp"),
    "bmp": ("BMP", ".bmp"),
    "tiff": ("TIFF", ".tif"),
}
_DEMO_CLASSES = {
    "amber": (255, 170, 30),
    "cobalt": (30, 70, 220),
    "jade": (40, 170, 100),
    "ruby": (200, 20, 60),
}
_NOISE_LUT = [v & 7 for v in range(256)]
_MTIME = 1_700_000_000  # fixed member mtime: the archive's sha256 must not depend on the clock


def synth_photo(rng: np.random.Generator, height: int, width: int) -> Image.Image:
    """An RGB image with photo-like statistics: smooth gradients, hard-edged shapes, texture, noise.

    Args:
        rng: the only source of randomness.
        height: rows, >= 1.
        width: columns, >= 1.

    Returns:
        A new ``RGB`` image of ``(width, height)``.
    """
    if height < 1 or width < 1:
        raise ValueError(f"size {height} x {width} must be at least 1 x 1")
    # Smooth colour field with blotchy mid-frequency texture, built at 1/8 scale, upsampled once.
    low_h, low_w = max(1, height // 8), max(1, width // 8)
    grid = rng.integers(20, 236, (int(rng.integers(2, 5)), int(rng.integers(2, 5)), 3), np.uint8)
    low = np.asarray(
        Image.fromarray(grid).resize((low_w, low_h), Image.Resampling.BICUBIC), np.int16
    ) + rng.integers(-20, 21, (low_h, low_w, 1), np.int16)
    img = Image.fromarray(np.clip(low, 0, 255).astype(np.uint8)).resize(
        (width, height), Image.Resampling.BILINEAR
    )
    draw = ImageDraw.Draw(img)  # hard-edged shapes
    for _ in range(int(rng.integers(2, 6))):
        x0, x1 = sorted(rng.integers(-width // 4, width + width // 4 + 1, 2).tolist())
        y0, y1 = sorted(rng.integers(-height // 4, height + height // 4 + 1, 2).tolist())
        colour = tuple(rng.integers(0, 256, 3).tolist())
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif kind == 1:
            draw.rectangle((x0, y0, x1, y1), fill=colour, outline=(0, 0, 0))
        else:
            corners = zip(
                rng.integers(0, width, 3).tolist(), rng.integers(0, height, 3).tolist(), strict=True
            )
            draw.polygon(list(corners), fill=colour)
    # Mild per-pixel noise in -4..3, in C: random bytes masked to 0..7, added with offset -4.
    noise = Image.frombytes("L", (width, height), rng.bytes(width * height)).point(_NOISE_LUT)
    return ImageChops.add(img, Image.merge("RGB", (noise, noise, noise)), 1.0, -4)


def write_image_folder(
    root: str | os.PathLike[str],
    *,
    classes: Sequence[str],
    per_class: int,
    splits: Sequence[str] = (),
    seed: int = 0,
    size: Size = (48, 64),
    formats: Sequence[str] = ("jpeg", "png"),
) -> list[Path]:
    """Write an ImageFolder (``root/[split/]class/file``) of synthetic photos.

    Args:
        root: the folder to fill (created if missing).
        classes: class folder names.
        per_class: images per class (per split, when there are splits).
        splits: split folder names from ``h5forge.discover.catalog.SPLIT_NAMES``; ``()`` for none.
        seed: the seed; every image has its own stream, so files do not depend on each other.
        size: ``(H, W)``, or ``((H_min, H_max), (W_min, W_max))`` for random sizes (inclusive).
        formats: cycled over the images of a class: ``jpeg``, ``png``, ``webp``, ``bmp``, ``tiff``.

    Returns:
        The written files, sorted.
    """
    _check_folder_args(classes, per_class, splits, formats)
    written = []
    for s, split in enumerate(splits or ("",)):
        for c, cls in enumerate(classes):
            folder = Path(root, split, cls)
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                rng = np.random.default_rng([seed, s, c, i])
                fmt = formats[i % len(formats)]
                path = folder / f"{cls}_{i:04d}{_FORMATS[fmt][1]}"
                path.write_bytes(_encode(synth_photo(rng, *_pick_size(rng, size)), fmt))
                written.append(path)
    return sorted(written)


def write_bad_files(folder: str | os.PathLike[str]) -> dict[str, str]:
    """Write one file of every awkward input kind that the pipeline must handle.

    Kinds: ``zero-byte``, ``truncated-jpeg``, ``truncated-png``, ``random-bytes``, ``html``,
    ``bomb-header`` (a PNG whose header declares 20000 x 20000), ``cmyk-jpeg``, ``png-16bit``,
    ``palette-transparency``, ``exif-orientation-6``, ``exif-orientation-8``, ``animated-gif``,
    ``tiny-1x1`` and ``elongated-1x2000`` (1 wide, 2000 high).

    Args:
        folder: where to write (created if missing).

    Returns:
        ``{file name: kind}``.
    """
    rng = np.random.default_rng(1234)
    photo = synth_photo(rng, 40, 60)
    jpeg = _encode(photo, "jpeg")
    png = _encode(photo, "png")
    palette = photo.quantize(16)
    palette.info["transparency"] = 0
    gray16 = np.arange(32 * 48, dtype=np.uint16).reshape(32, 48) * 42
    frames = [synth_photo(rng, 24, 32) for _ in range(3)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    files = {
        "zero-byte.jpg": ("zero-byte", b""),
        "truncated.jpg": ("truncated-jpeg", jpeg[: len(jpeg) * 2 // 3]),
        "truncated.png": ("truncated-png", png[: len(png) * 2 // 3]),
        "random-bytes.jpg": ("random-bytes", rng.bytes(2048)),
        "page.jpg": ("html", b"<!DOCTYPE html><html><body><h1>404 Not Found</h1></body></html>"),
        "bomb.png": ("bomb-header", _png_header_only(20_000, 20_000)),
        "cmyk.jpg": ("cmyk-jpeg", _encode(photo.convert("CMYK"), "jpeg")),
        "gray16.png": ("png-16bit", _encode(Image.fromarray(gray16), "png")),
        "palette-transparent.png": ("palette-transparency", _encode(palette, "png")),
        "exif-6.jpg": ("exif-orientation-6", _encode(photo, "jpeg", orientation=6)),
        "exif-8.jpg": ("exif-orientation-8", _encode(photo, "jpeg", orientation=8)),
        "animated.gif": ("animated-gif", gif.getvalue()),
        "tiny-1x1.png": ("tiny-1x1", _encode(Image.new("RGB", (1, 1), (10, 120, 250)), "png")),
        "strip-1x2000.png": ("elongated-1x2000", _encode(synth_photo(rng, 2000, 1), "png")),
    }
    Path(folder).mkdir(parents=True, exist_ok=True)
    for name, (_, data) in files.items():
        Path(folder, name).write_bytes(data)
    return {name: kind for name, (kind, _) in files.items()}


def make_demo_archive(dest_dir: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write the demo dataset as a reproducible ``.tar.gz`` (same bytes, same sha256, every run).

    The archive holds ``train/`` and ``val/`` at its top level, 4 classes (60 + 15 images each)
    of JPEG and PNG photos of 64-160 px, and exactly 2 broken files (a zero-byte JPEG and a
    truncated PNG) so quarantine shows while staying under 1% of the inputs.

    Args:
        dest_dir: folder for ``h5forge-demo.tar.gz`` (created if missing; replaced atomically).
        seed: changes every image.

    Returns:
        The archive's path.
    """
    members: dict[str, bytes] = {}
    for s, (split, count) in enumerate((("train", 60), ("val", 15))):
        for c, (cls, tint) in enumerate(_DEMO_CLASSES.items()):
            for i in range(count):
                rng = np.random.default_rng([seed, s, c, i])
                img = synth_photo(rng, *_pick_size(rng, ((64, 160), (64, 160))))
                # A class colour cast, so that a model trained on the demo can learn something.
                img = Image.blend(img, Image.new("RGB", img.size, tint), 0.3)
                fmt = ("jpeg", "png")[i % 2]
                members[f"{split}/{cls}/{cls}_{i:04d}{_FORMATS[fmt][1]}"] = _encode(img, fmt)
    members["train/amber/broken_zero.jpg"] = b""
    good_png = members["val/cobalt/cobalt_0001.png"]
    members["val/cobalt/broken_truncated.png"] = good_png[: len(good_png) // 2]
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / DEMO_ARCHIVE_NAME
    # A fresh name created exclusively: never written through a link planted beside ``out``.
    tmp = dest / f".{DEMO_ARCHIVE_NAME}.partial-{secrets.token_hex(6)}"
    try:
        with (
            os.fdopen(create_exclusive(tmp, 0o644), "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        ):
            _write_tar(gz, members)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def _write_tar(fileobj: gzip.GzipFile, members: dict[str, bytes]) -> None:
    dirs = {str(Path(name).parents[i]) for name in members for i in range(2)}
    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(dirs | set(members)):
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = _MTIME, 0, 0, "", ""
            if name in dirs:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(members[name]), 0o644
                tar.addfile(info, io.BytesIO(members[name]))


def _encode(img: Image.Image, fmt: str, *, orientation: int = 1) -> bytes:
    buf = io.BytesIO()
    # PNG level 1: noisy photos barely compress better at higher levels, which are much slower.
    extra: dict[str, object] = {"quality": 90} if fmt in ("jpeg", "webp") else {}
    if fmt == "png":
        extra["compress_level"] = 1
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        extra["exif"] = exif
    img.save(buf, _FORMATS[fmt][0], **extra)
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + chunk(b"IEND", b"")
    )


def _pick_size(rng: np.random.Generator, size: Size) -> tuple[int, int]:
    h, w = size
    if isinstance(h, int) and isinstance(w, int):
        return h, w
    assert isinstance(h, tuple)
    assert isinstance(w, tuple)
    return int(rng.integers(h[0], h[1] + 1)), int(rng.integers(w[0], w[1] + 1))


def _check_folder_args(
    classes: Sequence[str], per_class: int, splits: Sequence[str], formats: Sequence[str]
) -> None:
    if isinstance(classes, str) or not classes or len(set(classes)) != len(classes):
        raise ValueError(f"classes={classes!r} must be a non-empty sequence of distinct names")
    bad = [c for c in classes if not c or c.startswith(".") or "/" in c or "\\" in c]
    if bad:
        raise ValueError(
            f"class names {bad!r} must be non-empty, not start with '.', hold no slash"
        )
    if per_class < 1:
        raise ValueError(f"per_class={per_class!r} must be >= 1")
    if isinstance(splits, str) or any(s not in SPLIT_NAMES for s in splits):
        raise ValueError(f"splits={splits!r} must be names from {SPLIT_NAMES}")
    unknown = [f for f in formats if f not in _FORMATS]
    if isinstance(formats, str) or not formats or unknown:
        raise ValueError(f"formats={formats!r}: each must be one of {sorted(_FORMATS)}")

"""The default decoder and resize kernel (simplejpeg + torch) against the Pillow path: pixels
on real photographs within the stated PSNR, and Pillow taking over per image where simplejpeg
does not decode a file as Pillow would.

The photos are the real ones scikit-image ships inside its wheel (``skimage/data``), read from
the installed package folder: nothing is fetched.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from h5forge.preprocess import jpeg
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.images import Processed, Quarantined, process_file
from tests.fixtures.images import BadImages

# The pack before these options: Pillow decodes, Pillow resizes.
PILLOW: dict[str, Any] = {"decoder": "pillow", "resample": "pillow"}
# The stated bound (issue 31, docs/FORMAT.md): mean PSNR >= 40 dB, every image >= 35 dB.
MEAN_DB, WORST_DB = 40.0, 35.0
# Real photographs among skimage's bundled samples (grey ones included).
PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "motorcycle_left.png",
    "rocket.jpg",
    "camera.png",
    "grass.png",
    "gravel.png",
    "retina.jpg",
)


def _skimage_photo(name: str) -> Image.Image:
    spec = importlib.util.find_spec("skimage")
    assert spec is not None, "scikit-image (the test extra) ships the photos"
    assert spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    with Image.open(path) as im:
        return im.convert("L" if im.mode == "L" else "RGB")


def _jpeg(img: Image.Image, **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kw)
    return buf.getvalue()


def _ok(r: Processed | Quarantined) -> np.ndarray:
    assert isinstance(r, Processed), r
    assert r.digest == hashlib.sha256(r.data).digest()
    return np.frombuffer(r.data, np.uint8).reshape(r.shape)


def _both(path: Path, **cfg: Any) -> tuple[np.ndarray, np.ndarray]:
    """(default path, Pillow path) pixels of one file."""
    new = _ok(process_file(0, str(path), ImageConfig(**cfg)))
    old = _ok(process_file(0, str(path), ImageConfig(**cfg, **PILLOW)))
    assert new.shape == old.shape
    return new, old


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


@pytest.mark.parametrize(
    "cfg",
    [
        {},  # shorter side 224 + centre crop, RGB: the pack's default
        {"mode": "L", "size": (160, 160)},
        {"resize": "resize", "size": (96, 128)},
    ],
    ids=["default", "grey-160", "resize-96x128"],
)
def test_real_photos_stay_within_the_stated_psnr(tmp_path: Path, cfg: dict[str, Any]) -> None:
    scores = []
    for i, name in enumerate(PHOTOS):
        photo = _skimage_photo(name)
        exif = Image.Exif()
        exif[0x0112] = (1, 6, 3, 8)[i % 4]  # the transposition after the resize
        variants = {
            "q75": _jpeg(photo, quality=75, exif=exif),
            "q95-444": _jpeg(photo, quality=95, subsampling=0),
            "progressive": _jpeg(photo, quality=85, progressive=True),
            # twice the size: DCT-scaled decode at 1/2 (an odd width: a partial last column)
            "x2": _jpeg(photo.resize((photo.width * 2 + 1, photo.height * 2)), quality=90),
        }
        for variant, data in variants.items():
            path = tmp_path / f"{Path(name).stem}-{variant}.jpg"
            path.write_bytes(data)
            scores.append(_psnr(*_both(path, **cfg)))
    finite = [min(s, 99.0) for s in scores]
    assert min(scores) >= WORST_DB, sorted(scores)[:5]
    assert sum(finite) / len(finite) >= MEAN_DB, sum(finite) / len(finite)


def test_png_and_cmyk_are_decoded_by_pillow(bad_images: BadImages) -> None:
    # simplejpeg does not take them: the same Pillow decode, whichever decoder is configured.
    for kind in ("cmyk-jpeg", "png-16bit", "palette-transparency", "animated-gif"):
        path = bad_images.path(kind)
        with Image.open(path) as img:
            assert not jpeg.accepts(img)
        cfg = ImageConfig(size=(48, 48))
        got = _ok(process_file(0, str(path), cfg))
        pillow_decoded = _ok(
            process_file(0, str(path), ImageConfig(size=(48, 48), decoder="pillow"))
        )
        np.testing.assert_array_equal(got, pillow_decoded)
        _, old = _both(path, size=(48, 48))
        assert _psnr(got, old) >= WORST_DB


def test_a_jpeg_simplejpeg_refuses_falls_back_to_pillow(tmp_path: Path) -> None:
    # Bytes between the scan and the end marker: libjpeg-turbo warns ("extraneous bytes
    # before marker"), simplejpeg (strict) refuses, Pillow decodes the image all the same.
    photo = _skimage_photo("chelsea.png")
    data = _jpeg(photo, quality=90)
    assert data.endswith(b"\xff\xd9")
    odd = data[:-2] + b"\x00\x01\x02\x03" + data[-2:]
    path = tmp_path / "extraneous.jpg"
    path.write_bytes(odd)
    with Image.open(path) as img:
        assert jpeg.accepts(img)
        size = img.size
    assert jpeg.decode(odd, file_size=size, scale=1, mode="RGB") is None
    got = _ok(process_file(0, str(path), ImageConfig()))
    pillow_decoded = _ok(process_file(0, str(path), ImageConfig(decoder="pillow")))
    np.testing.assert_array_equal(got, pillow_decoded)


def test_a_truncated_jpeg_is_quarantined_with_pillows_reason(bad_images: BadImages) -> None:
    path = bad_images.path("truncated-jpeg")
    raw = path.read_bytes()
    with Image.open(path) as img:
        assert jpeg.decode(raw, file_size=img.size, scale=1, mode="RGB") is None
    new = process_file(3, str(path), ImageConfig())
    old = process_file(3, str(path), ImageConfig(**PILLOW))
    assert isinstance(new, Quarantined)
    assert new == old
    assert new.reason.startswith("truncated image: ")


def test_grey_and_progressive_jpegs_take_the_fast_path(tmp_path: Path) -> None:
    grey = _skimage_photo("camera.png")
    colour = _skimage_photo("coffee.png")
    for name, data in {
        "grey.jpg": _jpeg(grey, quality=90),
        "progressive.jpg": _jpeg(colour, quality=90, progressive=True),
    }.items():
        path = tmp_path / name
        path.write_bytes(data)
        with Image.open(path) as img:
            assert jpeg.accepts(img)
            assert jpeg.decode(data, file_size=img.size, scale=1, mode="RGB") is not None
        new, old = _both(path)
        assert _psnr(new, old) >= WORST_DB
        if name == "grey.jpg":  # replicated into every channel, as Pillow converts it
            assert (new[:, :, 0] == new[:, :, 1]).all()
            assert (new[:, :, 0] == new[:, :, 2]).all()


def test_the_pillow_path_is_the_pack_before_the_options(tmp_path: Path) -> None:
    # decoder="pillow", resample="pillow" is byte for byte the Pillow-only pack: a JPEG drafted
    # at 1/2 and EXIF-rotated, resized by Pillow over the crop's box.
    from h5forge.preprocess import normalise as norm

    photo = _skimage_photo("astronaut.png").resize((1030, 1024))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "big.jpg"
    path.write_bytes(_jpeg(photo, quality=90, exif=exif))
    cfg = ImageConfig(**PILLOW)
    with Image.open(path) as img:
        plan = norm.plan(img.size, 6, cfg)
        assert plan is not None
        region = norm.draft(img, plan, 6)
        img.load()
        expected = norm.apply(img.transpose(norm.TRANSPOSE[6]).convert("RGB"), plan, region)
    np.testing.assert_array_equal(_ok(process_file(0, str(path), cfg)), np.asarray(expected))

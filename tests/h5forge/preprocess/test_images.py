"""Tests for h5forge.preprocess.images: normalisation, resize, storage and quarantine.

Expected pixels are computed independently with plain Pillow/numpy operations.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageFile

from h5forge.demo import synth_photo
from h5forge.errors import IntegrityError
from h5forge.preprocess.config import ImageConfig
from h5forge.preprocess.images import (
    Processed,
    Quarantined,
    decode_stored,
    load_normalised,
    process_file,
)
from tests.fixtures.images import BadImages

NATIVE = ImageConfig(resize="none", size=None)
BILINEAR = Image.Resampling.BILINEAR
# The Pillow path (the pack before issue 31, exact to Pillow's own resize) and the default
# (simplejpeg + torch's antialiased bilinear: the same filter and geometry, within rounding).
PILLOW: dict[str, Any] = {"decoder": "pillow", "resample": "pillow"}
KERNELS = pytest.mark.parametrize("kernel", [PILLOW, {}], ids=["pillow", "default"])


def _ok(r: Processed | Quarantined) -> Processed:
    assert isinstance(r, Processed), r
    assert r.digest == hashlib.sha256(r.data).digest()
    return r


def _pixels(r: Processed) -> np.ndarray:
    return np.frombuffer(r.data, np.uint8).reshape(r.shape)


def _rgb(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("RGB"))


def _save(img: Image.Image, path: Path, **kw: Any) -> Path:
    img.save(path, **kw)
    return path


def _torchvision_recipe(img: Image.Image, side: int, h: int, w: int) -> Image.Image:
    """Resize(side) + CenterCrop((h, w)) as torchvision computes them for PIL images."""
    iw, ih = img.size
    size = (side, int(side * ih / iw)) if iw <= ih else (int(side * iw / ih), side)
    img = img.resize(size, BILINEAR)
    top, left = int(round((size[1] - h) / 2.0)), int(round((size[0] - w) / 2.0))
    return img.crop((left, top, left + w, top + h))


def _crop_region_recipe(img: Image.Image, side: int, h: int, w: int) -> Image.Image:
    """The same geometry resampling only the crop's source region (Pillow's ``box``)."""
    iw, ih = img.size
    size = (side, int(side * ih / iw)) if iw <= ih else (int(side * iw / ih), side)
    top, left = int(round((size[1] - h) / 2.0)), int(round((size[0] - w) / 2.0))
    sx, sy = iw / size[0], ih / size[1]
    return img.resize((w, h), BILINEAR, box=(left * sx, top * sy, (left + w) * sx, (top + h) * sy))


def _within_one(got: np.ndarray, reference: np.ndarray) -> float:
    """Assert every value is within 1 of the reference; return the fraction that differs."""
    diff = np.abs(got.astype(np.int16) - reference.astype(np.int16))
    assert diff.max() <= 1, diff.max()
    return float(np.count_nonzero(diff)) / diff.size


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layout": "flat"}, "layout='flat' is not one of"),
        ({"encoding": "gif", "layout": "encoded"}, "encoding='gif' is not one of"),
        ({"encoding": "jpeg"}, "only applies to layout='encoded'"),
        ({"quality": 0}, r"quality=0 must be an int in 1\.\.100"),
        ({"quality": True}, "quality=True"),
        ({"mode": "RGBA"}, "mode='RGBA' is not one of"),
        ({"resize": "fit"}, "resize='fit' is not one of"),
        ({"size": None}, "size=None needs resize='none'"),
        ({"size": (224,)}, r"size=\(224,\) must be \(H, W\)"),
        ({"size": (0, 10)}, r"size 0x10 is out of range: height and width must be 8\.\.4096"),
        ({"shorter_side": 100}, r"shorter_side=100 must be an int >= max\(size\) = 224"),
        ({"max_image_pixels": 0}, "max_image_pixels=0 must be an int >= 1"),
        ({"decoder": "turbojpeg"}, "decoder='turbojpeg' is not one of 'simplejpeg', 'pillow'"),
        ({"resample": "cv2"}, "resample='cv2' is not one of 'torch', 'pillow'; leave the"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ImageConfig(**kwargs)


def test_config_json_is_canonical_and_round_trips() -> None:
    cfg = ImageConfig(layout="encoded", encoding="webp", size=(64, 48), shorter_side=80)
    text = cfg.to_json()
    assert text == (
        '{"decoder":"simplejpeg","encoding":"webp","layout":"encoded",'
        '"max_image_pixels":89478485,"mode":"RGB","quality":90,"resample":"torch",'
        '"resize":"shorter-side","shorter_side":80,"size":[64,48]}'
    )
    assert ImageConfig.from_json(text) == cfg
    assert ImageConfig(size=[64, 48]).size == (64, 48)  # type: ignore[arg-type]


def test_config_json_of_the_pillow_path_is_that_of_files_before_the_decoder_options() -> None:
    # Files packed before `decoder`/`resample` existed have this config_json (and hash); the
    # Pillow path gives their pixels, so it must hash the same (no re-pack), and their JSON
    # must read back as the Pillow path, not as the new defaults.
    before = (
        '{"encoding":"webp","layout":"encoded","max_image_pixels":89478485,"mode":"RGB",'
        '"quality":90,"resize":"shorter-side","shorter_side":80,"size":[64,48]}'
    )
    pillow = ImageConfig(
        layout="encoded",
        encoding="webp",
        size=(64, 48),
        shorter_side=80,
        decoder="pillow",
        resample="pillow",
    )
    assert pillow.to_json() == before
    assert ImageConfig.from_json(before) == pillow
    assert ImageConfig.from_json(before) != ImageConfig.from_json(
        before.replace('"encoding"', '"decoder":"simplejpeg","encoding"')
    )


def test_truncated_images_are_not_loaded_by_pillow() -> None:
    import h5forge.preprocess.images  # noqa: F401  (importing must not change the global)

    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


# --- awkward inputs -------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [NATIVE, ImageConfig(size=(32, 32))], ids=["native", "resized"])
def test_every_awkward_kind_has_its_outcome(bad_images: BadImages, cfg: ImageConfig) -> None:
    for i, (name, expected) in enumerate(sorted(bad_images.expected.items())):
        path = str(bad_images.folder / name)
        r = process_file(i, path, cfg)
        assert r.index == i
        if expected == "ok":
            assert isinstance(r, Processed), f"{name}: {r}"
            if cfg.size is not None:
                assert r.shape == (32, 32, 3), name
        else:
            assert isinstance(r, Quarantined), name
            assert r.path == path
            assert r.reason.startswith(expected), (name, r.reason)


def test_bomb_header_is_quarantined_without_allocating(bad_images: BadImages) -> None:
    path = str(bad_images.path("bomb-header"))
    r = process_file(0, path, NATIVE)
    assert isinstance(r, Quarantined)
    assert r.reason == "image too large: 20000 x 20000 = 400000000 pixels > limit 89478485"
    # A smaller per-config limit applies too, and Pillow's global is left as it was.
    before = Image.MAX_IMAGE_PIXELS
    small = process_file(0, str(bad_images.path("tiny-1x1")), ImageConfig(max_image_pixels=1))
    assert isinstance(small, Processed)
    strip = process_file(
        0,
        str(bad_images.path("elongated-1x2000")),
        ImageConfig(resize="none", size=None, max_image_pixels=1999),
    )
    assert isinstance(strip, Quarantined)
    assert strip.reason == "image too large: 1 x 2000 = 2000 pixels > limit 1999"
    assert before == Image.MAX_IMAGE_PIXELS


def test_unreadable_path_is_quarantined(tmp_path: Path) -> None:
    r = process_file(3, str(tmp_path), NATIVE)  # a folder cannot be read as a file
    assert isinstance(r, Quarantined)
    assert r.reason.startswith("unreadable: ")
    missing = process_file(4, str(tmp_path / "gone.jpg"), NATIVE)
    assert isinstance(missing, Quarantined)
    assert missing.reason == "unreadable: No such file or directory"


def test_cmyk_jpeg_converts_like_pillow(bad_images: BadImages) -> None:
    path = bad_images.path("cmyk-jpeg")
    with Image.open(path) as src:
        assert src.mode == "CMYK"
        expected = _rgb(src)
    np.testing.assert_array_equal(_pixels(_ok(process_file(0, str(path), NATIVE))), expected)


def test_16_bit_png_keeps_the_high_byte(bad_images: BadImages) -> None:
    path = bad_images.path("png-16bit")
    with Image.open(path) as src:
        assert src.mode.startswith("I;16")
        high = (np.asarray(src).astype(np.uint32) >> 8).astype(np.uint8)
    np.testing.assert_array_equal(
        _pixels(_ok(process_file(0, str(path), NATIVE))), np.repeat(high[:, :, None], 3, axis=2)
    )
    gray = _ok(process_file(0, str(path), ImageConfig(resize="none", size=None, mode="L")))
    np.testing.assert_array_equal(_pixels(gray)[:, :, 0], high)


def test_palette_transparency_is_composited_on_white(bad_images: BadImages) -> None:
    path = bad_images.path("palette-transparency")
    with Image.open(path) as src:
        assert src.mode == "P"
        index = np.asarray(src)
        palette = np.array(src.getpalette(), np.uint8).reshape(-1, 3)
        transparent = src.info["transparency"]
    expected = palette[index]
    expected[index == transparent] = 255
    assert (index == transparent).any()
    assert (index != transparent).any()
    np.testing.assert_array_equal(_pixels(_ok(process_file(0, str(path), NATIVE))), expected)


def test_rgba_alpha_is_composited_on_white(tmp_path: Path) -> None:
    rgba = synth_photo(np.random.default_rng(0), 20, 30).convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, 30).astype(np.uint8), (20, 1))
    rgba.putalpha(Image.fromarray(alpha))
    path = _save(rgba, tmp_path / "a.png")
    rgb = np.asarray(rgba)[:, :, :3].astype(float)
    a = alpha[:, :, None] / 255.0
    expected = rgb * a + 255 * (1 - a)
    got = _pixels(_ok(process_file(0, str(path), NATIVE))).astype(float)
    assert np.abs(got - expected).max() <= 1.0


@pytest.mark.parametrize(
    ("kind", "angle"), [("exif-orientation-6", -90), ("exif-orientation-8", 90)]
)
def test_exif_orientation_is_applied(bad_images: BadImages, kind: str, angle: int) -> None:
    path = bad_images.path(kind)
    with Image.open(path) as src:
        w, h = src.size
        expected = _rgb(src.rotate(angle, expand=True))
    r = _ok(process_file(0, str(path), NATIVE))
    assert r.shape == (w, h, 3)  # width and height swapped
    np.testing.assert_array_equal(_pixels(r), expected)


def test_animated_gif_uses_the_first_frame(bad_images: BadImages) -> None:
    path = bad_images.path("animated-gif")
    with Image.open(path) as src:
        assert getattr(src, "n_frames", 1) == 3
        expected = _rgb(src)
        src.seek(1)
        second = _rgb(src)
    got = _pixels(_ok(process_file(0, str(path), NATIVE)))
    np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(got, second)


def test_one_pixel_image_upscales_to_a_flat_colour(bad_images: BadImages) -> None:
    r = _ok(process_file(0, str(bad_images.path("tiny-1x1")), ImageConfig(size=(10, 8))))
    assert r.shape == (10, 8, 3)
    assert (_pixels(r) == np.array([10, 120, 250], np.uint8)).all()


def test_elongated_image_keeps_the_recipe_geometry(bad_images: BadImages) -> None:
    path = bad_images.path("elongated-1x2000")
    with Image.open(path) as src:
        expected = np.asarray(_torchvision_recipe(src.convert("RGB"), 32, 32, 32), np.int16)
    r = _ok(process_file(0, str(path), ImageConfig(size=(32, 32))))
    assert r.shape == (32, 32, 3)
    assert np.abs(_pixels(r).astype(np.int16) - expected).max() <= 1


# --- pixels against independent Pillow computations -----------------------------------------


def test_native_decode_matches_pillow(image_folder: Path) -> None:
    for path in sorted(image_folder.rglob("*.*")):
        with Image.open(path) as src:
            if src.mode not in ("RGB", "L"):
                continue
            expected = _rgb(src)
        np.testing.assert_array_equal(_pixels(_ok(process_file(0, str(path), NATIVE))), expected)


def test_grayscale_replicates_and_rgb_converts_to_luma(image_folder: Path) -> None:
    gray_path = image_folder / "cat" / "gray.png"
    with Image.open(gray_path) as src:
        gray = np.asarray(src)
    rgb = _pixels(_ok(process_file(0, str(gray_path), NATIVE)))
    assert all(np.array_equal(rgb[:, :, c], gray) for c in range(3))
    colour_path = image_folder / "cat" / "cat_0001.png"
    with Image.open(colour_path) as src:
        luma = np.asarray(src.convert("L"))
    lum = _ok(process_file(0, str(colour_path), ImageConfig(resize="none", size=None, mode="L")))
    assert lum.shape == (*luma.shape, 1)
    np.testing.assert_array_equal(_pixels(lum)[:, :, 0], luma)


@pytest.mark.parametrize(
    ("size", "side", "src_hw"),
    [
        ((32, 32), None, (50, 80)),
        ((24, 32), 40, (90, 61)),
        ((16, 16), None, (16, 40)),
        ((20, 20), 20, (20, 20)),
    ],
)
@KERNELS
def test_shorter_side_matches_torchvision(
    tmp_path: Path,
    size: tuple[int, int],
    side: int | None,
    src_hw: tuple[int, int],
    kernel: dict[str, Any],
) -> None:
    photo = synth_photo(np.random.default_rng(1), *src_hw)
    path = _save(photo, tmp_path / "p.png")
    cfg = ImageConfig(size=size, shorter_side=side, **kernel)
    r = _ok(process_file(0, str(path), cfg))
    assert r.shape == (*size, 3)
    region = np.asarray(_crop_region_recipe(photo, side or max(size), *size))
    if kernel == PILLOW:
        np.testing.assert_array_equal(_pixels(r), region)
    else:
        _within_one(_pixels(r), region)
    _within_one(_pixels(r), np.asarray(_torchvision_recipe(photo, side or max(size), *size)))


def test_shorter_side_known_crop_window(tmp_path: Path) -> None:
    # 80 x 50 -> Resize(32) gives 51 x 32; CenterCrop(32) starts at round(9.5) = 10.
    photo = synth_photo(np.random.default_rng(2), 50, 80)
    path = _save(photo, tmp_path / "p.png")
    got = _pixels(_ok(process_file(0, str(path), ImageConfig(size=(32, 32)))))
    resized = np.asarray(photo.resize((51, 32), BILINEAR))
    _within_one(got, resized[:, 10:42])
    # One column off would differ by far more than 1 on this textured image.
    shifted = np.abs(got[:, :-1].astype(np.int16) - resized[:, 11:42].astype(np.int16))
    assert shifted.max() > 8


@pytest.mark.parametrize(
    ("kernel", "most"), [(PILLOW, 0.005), ({}, 0.05)], ids=["pillow", "default"]
)
def test_photo_sized_crop_differs_from_torchvision_on_few_values(
    tmp_path: Path, kernel: dict[str, Any], most: float
) -> None:
    # A 4:3 photo: the Pillow path resamples only the crop's box, so few weights round
    # differently; torch's kernel has its own fixed-point rounding, still within one.
    photo = synth_photo(np.random.default_rng(4), 375, 500)
    path = _save(photo, tmp_path / "p.png")
    got = _pixels(_ok(process_file(0, str(path), ImageConfig(size=(224, 224), **kernel))))
    assert _within_one(got, np.asarray(_torchvision_recipe(photo, 224, 224, 224))) < most


@KERNELS
def test_resize_policy_matches_pillow(image_folder: Path, kernel: dict[str, Any]) -> None:
    path = image_folder / "dog" / "dog_0002.jpg"
    with Image.open(path) as src:
        expected = np.asarray(src.convert("RGB").resize((40, 24), BILINEAR))
    r = _ok(process_file(0, str(path), ImageConfig(resize="resize", size=(24, 40), **kernel)))
    if kernel == PILLOW:
        np.testing.assert_array_equal(_pixels(r), expected)
    else:
        _within_one(_pixels(r), expected)


@KERNELS
@pytest.mark.parametrize("orientation", [1, 2, 3, 4, 5, 6, 7, 8])
def test_jpeg_draft_keeps_quality_and_geometry(
    tmp_path: Path, orientation: int, kernel: dict[str, Any]
) -> None:
    photo = synth_photo(np.random.default_rng(3), 601, 803)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = _save(photo, tmp_path / "big.jpg", quality=95, exif=exif)
    cfg = ImageConfig(size=(64, 64), **kernel)
    with Image.open(path) as src:
        full = src.convert("RGB")  # decoded at full size: no draft
    upright = {
        1: full,
        2: full.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        3: full.rotate(180),
        4: full.transpose(Image.Transpose.FLIP_TOP_BOTTOM),
        5: full.transpose(Image.Transpose.TRANSPOSE),
        6: full.rotate(-90, expand=True),
        7: full.transpose(Image.Transpose.TRANSVERSE),
        8: full.rotate(90, expand=True),
    }[orientation]
    reference = np.asarray(_torchvision_recipe(upright, 64, 64, 64), np.int16)
    r = _ok(process_file(0, str(path), cfg))
    assert r.shape == (64, 64, 3)
    diff = np.abs(_pixels(r).astype(np.int16) - reference)
    assert diff.mean() < 1.5, diff.mean()
    # A geometry error of one drafted pixel would show as a much larger difference.
    shifted = np.abs(np.roll(_pixels(r), 1, axis=1).astype(np.int16) - reference)
    assert shifted.mean() > 2 * diff.mean()


# --- stored data ----------------------------------------------------------------------------


def test_original_encoding_keeps_source_bytes(image_folder: Path) -> None:
    path = image_folder / "owl" / "owl_0000.jpg"
    cfg = ImageConfig(layout="encoded", encoding="original", size=(16, 16))
    r = _ok(process_file(7, str(path), cfg))
    assert r.index == 7
    assert r.data == path.read_bytes()
    with Image.open(path) as src:
        expected = _rgb(src)
    assert r.shape == expected.shape  # the source size: original bytes are never resized
    got = decode_stored(r.data, r.shape, layout="encoded", encoding="original", mode="RGB")
    np.testing.assert_array_equal(got, expected)


def test_original_encoding_decodes_with_exif_rules(bad_images: BadImages) -> None:
    path = bad_images.path("exif-orientation-6")
    cfg = ImageConfig(layout="encoded", encoding="original", resize="none", size=None)
    r = _ok(process_file(0, str(path), cfg))
    native = _pixels(_ok(process_file(0, str(path), NATIVE)))
    got = decode_stored(memoryview(r.data), r.shape, layout="encoded", mode="RGB")
    np.testing.assert_array_equal(got, native)


@pytest.mark.parametrize("encoding", ["jpeg", "png", "webp"])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_reencoded_samples_decode_to_their_shape(
    image_folder: Path, encoding: str, mode: str
) -> None:
    path = image_folder / "dog" / "alpha.png"
    enc = ImageConfig(
        layout="encoded",
        encoding=encoding,
        mode=mode,  # type: ignore[arg-type]
        size=(20, 24),
        quality=80,
    )
    dec = ImageConfig(mode=mode, size=(20, 24))  # type: ignore[arg-type]
    r = _ok(process_file(0, str(path), enc))
    raw = _pixels(_ok(process_file(0, str(path), dec)))
    assert r.shape == raw.shape == (20, 24, 3 if mode == "RGB" else 1)
    got = decode_stored(
        r.data,
        r.shape,
        layout="encoded",
        encoding=encoding,  # type: ignore[arg-type]
        mode=mode,
    )  # type: ignore[arg-type]
    assert got.shape == r.shape
    assert got.flags.writeable
    assert got.flags.c_contiguous
    if encoding == "png":
        np.testing.assert_array_equal(got, raw)
    else:
        assert np.abs(got.astype(int) - raw).mean() < 12
    with Image.open(io.BytesIO(r.data)) as img:
        assert img.format == {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}[encoding]


def test_decode_stored_decoded_layout() -> None:
    arr = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    got = decode_stored(arr.tobytes(), (2, 3, 3), layout="decoded", mode="RGB")
    np.testing.assert_array_equal(got, arr)
    assert got.flags.writeable
    with pytest.raises(IntegrityError, match=r"holds 18 bytes, shape \(2, 3, 2\) needs 12"):
        decode_stored(arr.tobytes(), (2, 3, 2), layout="decoded", mode="RGB")


def test_decode_stored_checks_encoded_shape(image_folder: Path) -> None:
    data = (image_folder / "cat" / "gray.png").read_bytes()
    with pytest.raises(IntegrityError, match=r"decodes to \(30, 20, 3\), expected \(30, 21, 3\)"):
        decode_stored(data, (30, 21, 3), layout="encoded", mode="RGB")
    assert decode_stored(data, None, layout="encoded", mode="L").shape == (30, 20, 1)
    with pytest.raises(IntegrityError, match="encoded sample does not decode: cannot identify"):
        decode_stored(b"not an image", None, layout="encoded", mode="RGB")


def test_load_normalised_accepts_path_or_bytes(image_folder: Path) -> None:
    path = image_folder / "owl" / "palette.png"
    a = load_normalised(str(path), NATIVE)
    b = load_normalised(path.read_bytes(), ImageConfig(size=(8, 8)))  # resize not requested
    c = load_normalised(path.read_bytes(), ImageConfig(size=(8, 8)), resize=True)
    assert a.mode == b.mode == "RGB"
    assert a.size == b.size == (27, 33)
    assert c.size == (8, 8)

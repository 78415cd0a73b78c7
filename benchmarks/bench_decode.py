"""Decode + resize candidates for the pack, one core, CPU time, and their pixels vs today's.

Every candidate turns the bytes of one JPEG (read into memory first, not timed) into the pack's
default sample, shorter side 224 + centre crop 224 RGB, by the geometry of
:func:`h5forge.preprocess.normalise.plan`, except the "decode only" rows, which stop after
decoding (full size, no resize). Rates are images per CPU second of this process
(``time.process_time``) with torch, OpenCV and every library held to one thread, the median of
``--repeat`` interleaved rounds over the whole set. PSNR is against **today's output**: the
pack's Pillow path (``decoder="pillow"``, ``resample="pillow"``: libjpeg DCT scaling only at
>= 2x, Pillow's antialiased bilinear over the crop's source box), mean and worst image (a
candidate equal to it everywhere reads "exact"). A candidate whose library is not installed is
left out and named.

    python -m benchmarks.bench_decode                                    # generated photo set
    python -m benchmarks.bench_decode --images "$(python -m benchmarks.realphotos)"
"""

from __future__ import annotations

import io
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from benchmarks._common import image_root, parser, start_report, table
from benchmarks.photoset import image_files

Candidate = Callable[[bytes], np.ndarray]
# decoded pixels, the file's (W, H), and the decoded pixels per file pixel (M/8 of a scaled
# decode: the full image spans W * M/8 of them, the last column and row may be partial)
Decoded = tuple[np.ndarray, tuple[int, int], float]


def _plan(w: int, h: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    from h5forge.preprocess.config import ImageConfig
    from h5forge.preprocess.normalise import plan

    p = plan((w, h), 1, ImageConfig())
    assert p is not None
    assert p.crop is not None
    return p.size, p.crop


def _rgb(arr: np.ndarray) -> np.ndarray:
    return np.repeat(arr, 3, axis=2) if arr.ndim == 3 and arr.shape[2] == 1 else arr


def candidates() -> tuple[dict[str, Candidate], list[str]]:
    """Every candidate that can run here, and a note for each one that cannot."""
    from h5forge.preprocess.config import ImageConfig
    from h5forge.preprocess.decode import load_normalised, load_pixels

    missing: list[str] = []
    out: dict[str, Candidate] = {}
    today = ImageConfig(decoder="pillow", resample="pillow")
    chosen = ImageConfig()

    def h5forge_today(raw: bytes) -> np.ndarray:
        return _rgb(np.asarray(load_normalised(raw, today, resize=True)))

    def pillow_recipe(raw: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(raw)) as im:
            im = im.convert("RGB")
            size, crop = _plan(*im.size)
            return np.asarray(im.resize(size, Image.Resampling.BILINEAR).crop(crop))

    def pillow_decode(raw: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(raw)) as im:
            return np.asarray(im.convert("RGB"))

    def pillow_reducing_gap(raw: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(raw)) as im:
            size, crop = _plan(*im.size)
            im = im.convert("RGB")
            return np.asarray(
                im.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0).crop(crop)
            )

    def h5forge_chosen(raw: bytes) -> np.ndarray:
        return _rgb(np.ascontiguousarray(load_pixels(raw, chosen, resize=True)[0]))

    out["today: h5forge Pillow path (reference)"] = h5forge_today
    out["h5forge default now: simplejpeg + torch (ImageConfig())"] = h5forge_chosen
    out["Pillow recipe: decode, resize, crop"] = pillow_recipe
    out["Pillow, resize(reducing_gap=2.0), crop"] = pillow_reducing_gap
    out["Pillow decode only (full size)"] = pillow_decode

    try:
        import simplejpeg
    except ImportError:
        simplejpeg = None
        missing.append("simplejpeg (not installed)")
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:
        cv2 = None
        missing.append("OpenCV (opencv-python-headless not installed)")
    import torch

    torch.set_num_threads(1)

    def full(arr: np.ndarray) -> Decoded:
        return arr, (arr.shape[1], arr.shape[0]), 1.0

    def sj(raw: bytes, *, fast: bool = False, scale: str = "pow2") -> Decoded:
        """simplejpeg; ``scale``: "pow2" is today's DCT-scaling rule (1/2, 1/4, 1/8 only
        where the image is at least twice the resize), "eighths" lets libjpeg-turbo pick any
        M/8 that still covers the resize, "none" decodes at full size. Returns the pixels and
        the scale."""
        assert simplejpeg is not None
        if scale == "none":
            return full(simplejpeg.decode_jpeg(raw, "RGB", fastdct=fast, fastupsample=fast))
        h, w = simplejpeg.decode_jpeg_header(raw)[:2]
        (nw, nh), _ = _plan(w, h)
        if scale == "pow2":
            factor = min(w // nw, h // nh)
            a = next(a for a in (8, 4, 2, 1) if factor >= a)
            nw, nh = -(-w // a), -(-h // a)
        arr = simplejpeg.decode_jpeg(
            raw, "RGB", fastdct=fast, fastupsample=fast, min_width=nw, min_height=nh
        )
        return arr, (w, h), round(8 * arr.shape[1] / w) / 8  # the M/8 libjpeg-turbo chose

    def cv2_resize(decoded: Decoded, interp: int) -> np.ndarray:
        """OpenCV resizes the whole decoded array (its ``dsize`` fixes the scale): where a
        scaled decode has a partial last column or row, the geometry is off by under one
        scaled pixel."""
        assert cv2 is not None
        arr, (w, h), _ = decoded
        size, (left, top, right, bottom) = _plan(w, h)
        return cv2.resize(arr, size, interpolation=interp)[top:bottom, left:right]

    def torch_resize(decoded: Decoded) -> np.ndarray:
        """Antialiased bilinear with the scale of the full image's extent, so a partial last
        column or row is sampled as Pillow's box does."""
        arr, (w, h), m = decoded
        size, (left, top, right, bottom) = _plan(w, h)
        ew, eh = w * m, h * m
        x = torch.from_numpy(arr).permute(2, 0, 1).unsqueeze(0)
        x = x.contiguous(memory_format=torch.channels_last)
        y = torch.ops.aten._upsample_bilinear2d_aa(
            x, [size[1], size[0]], False, size[1] / eh, size[0] / ew
        )
        return y[0, :, top:bottom, left:right].permute(1, 2, 0).numpy()

    def pillow_box(decoded: Decoded) -> np.ndarray:
        arr, (w, h), m = decoded
        size, (left, top, right, bottom) = _plan(w, h)
        ew, eh = w * m, h * m
        sx, sy = ew / size[0], eh / size[1]
        box = (left * sx, top * sy, right * sx, bottom * sy)
        im = Image.fromarray(arr)
        return np.asarray(im.resize((right - left, bottom - top), Image.Resampling.BILINEAR, box))

    def pillow_decode_cv2(raw: bytes) -> np.ndarray:
        assert cv2 is not None
        with Image.open(io.BytesIO(raw)) as im:
            return cv2_resize(full(np.asarray(im.convert("RGB"))), cv2.INTER_AREA)

    if simplejpeg is not None:
        out["simplejpeg decode only (full size)"] = lambda raw: sj(raw, scale="none")
        out["simplejpeg decode only"] = lambda raw: sj(raw)
        out["simplejpeg decode only, fastdct+fastupsample"] = lambda raw: sj(raw, fast=True)
        out["simplejpeg + Pillow box resize"] = lambda raw: pillow_box(sj(raw))
        out["simplejpeg + torch antialiased bilinear"] = lambda raw: torch_resize(sj(raw))
        out["simplejpeg M/8 DCT scale + torch antialiased bilinear"] = lambda raw: torch_resize(
            sj(raw, scale="eighths")
        )
        out["simplejpeg fast + torch antialiased bilinear"] = lambda raw: torch_resize(
            sj(raw, fast=True)
        )
    if simplejpeg is not None and cv2 is not None:
        area, linear = cv2.INTER_AREA, cv2.INTER_LINEAR
        out["simplejpeg + cv2 INTER_AREA"] = lambda raw: cv2_resize(sj(raw), area)
        out["simplejpeg + cv2 INTER_LINEAR"] = lambda raw: cv2_resize(sj(raw), linear)
        out["simplejpeg fast + cv2 INTER_AREA"] = lambda raw: cv2_resize(sj(raw, fast=True), area)
        out["simplejpeg M/8 DCT scale + cv2 INTER_AREA"] = lambda raw: cv2_resize(
            sj(raw, scale="eighths"), area
        )
    if cv2 is not None:

        def cv2_decode(raw: bytes) -> np.ndarray:
            assert cv2 is not None
            bgr = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR)
            return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)

        out["Pillow decode (full size) + cv2 INTER_AREA"] = pillow_decode_cv2
        out["cv2.imdecode only (full size)"] = cv2_decode
        out["cv2.imdecode (full size) + cv2 INTER_AREA"] = lambda raw: cv2_resize(
            full(cv2_decode(raw)), area
        )
    try:
        import turbojpeg

        turbojpeg.TurboJPEG()
        missing.append("PyTurboJPEG: installs and finds libturbojpeg, not measured")
    except ImportError:
        missing.append("PyTurboJPEG (not installed)")
    except (OSError, RuntimeError) as e:
        missing.append(f"PyTurboJPEG (installs, but {str(e).splitlines()[0]})")
    missing.append("pillow-simd (no wheel on PyPI: source only, needs a compiler and libjpeg)")
    return out, missing


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two uint8 arrays in dB (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _fmt(db: float) -> str:
    return "exact" if math.isinf(db) else f"{db:.1f}"


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--sample", type=int, default=500, help="images measured, spread over the set (0: all)"
    )
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report = start_report("decode + resize candidates, one core, CPU time, PSNR vs today")
    root, what = image_root(args)
    files = image_files(root)
    if args.sample:
        files = files[:: max(1, len(files) // args.sample)][: args.sample]
    raws = [Path(f).read_bytes() for f in files]
    jpegs = [r for r in raws if r[:2] == b"\xff\xd8"]
    found, missing = candidates()
    # PSNR first (untimed): each candidate's output vs the reference, per image.
    ref_name = next(iter(found))
    reference = [found[ref_name](r) for r in jpegs]
    quality: dict[str, tuple[float, float]] = {}
    for name, fn in found.items():
        if "decode only" in name:
            continue
        scores = [psnr(fn(r), ref) for r, ref in zip(jpegs, reference, strict=True)]
        finite = [s for s in scores if not math.isinf(s)]
        mean = statistics.fmean(finite) if finite else math.inf
        # mean of the per-image PSNRs; an exact image counts as 99 dB in it
        if finite and len(finite) < len(scores):
            mean = statistics.fmean([min(s, 99.0) for s in scores])
        quality[name] = (mean, min(scores))
    rates: dict[str, list[float]] = {name: [] for name in found}
    for r in range(args.repeat):
        names = list(found)
        k = r % len(names)
        for name in names[k:] + names[:k]:  # rotated, so drift hits every candidate alike
            fn = found[name]
            t0 = time.process_time()
            for raw in jpegs:
                fn(raw)
            rates[name].append(len(jpegs) / (time.process_time() - t0))
        print(f"  round {r + 1}/{args.repeat} done", flush=True)
    base = statistics.median(rates[ref_name])
    rows = []
    for name in found:
        rate = statistics.median(rates[name])
        mean, worst = quality.get(name, (math.nan, math.nan))
        rows.append(
            [
                name,
                f"{rate:,.0f}",
                f"{rate / base:.2f}",
                "" if math.isnan(mean) else _fmt(mean),
                "" if math.isnan(worst) else _fmt(worst),
            ]
        )
    report.add(
        f"Input: {what}; {len(jpegs)} JPEGs timed. One core: CPU seconds of this process, "
        f"median of {args.repeat} rotated rounds."
    )
    report.add(
        table(["candidate", "img/s (1 core)", "vs today", "PSNR mean dB", "PSNR worst dB"], rows)
    )
    if missing:
        report.add("Not measured: " + "; ".join(missing) + ".")
    report.write(not args.no_record)


if __name__ == "__main__":
    main()

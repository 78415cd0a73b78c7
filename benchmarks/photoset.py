"""The photo-like benchmark set: JPEGs around 500x375 with natural-image statistics.

Deterministic from ``--seed``, written once to ``benchmarks/data/photoset-v2-<count>-<seed>/
<class>/<n>.jpg`` (gitignored) and reused. Each image is ``h5forge.demo.synth_photo`` (smooth
colour fields, hard-edged shapes, mild noise) plus grain: luminance texture at 1/3 scale and
per-pixel luminance and chroma noise. Without the grain the JPEGs are ~0.17 bytes per pixel;
with it ~0.45, closer to real photos (ImageNet's average ~110 KB at ~500x375 is ~0.6), which
matters for file sizes, remote bytes and decode time. Sizes follow ImageNet's common shapes:
mostly 500x375 and 500x333 landscape, a quarter portrait (375x500). JPEG quality 90, 4:2:0
chroma subsampling (Pillow's default).

    python -m benchmarks.photoset --count 2000 --seed 0     # prints the folder
"""

from __future__ import annotations

import argparse
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

#: Generated inputs and files of every benchmark (git-ignored); ``_common`` re-uses it.
DATA = Path(__file__).resolve().parent / "data"
CLASSES = 10
_SHAPES = ((375, 500), (333, 500), (375, 500), (500, 375))  # (H, W)


def _grain(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Film-like grain: luminance texture at 1/3 scale plus per-pixel luma and chroma noise."""
    w, h = img.size
    mid = Image.fromarray(
        rng.normal(128, 20, (h // 3 + 1, w // 3 + 1)).clip(0, 255).astype(np.uint8)
    ).resize((w, h), Image.Resampling.BICUBIC)
    out = (
        np.asarray(img, np.int16)
        + (np.asarray(mid, np.int16)[..., None] - 128)
        + rng.normal(0, 10, (h, w, 1))
        + rng.normal(0, 3, (h, w, 3))
    )
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))


def _one(args: tuple[int, int, str, tuple[int, int] | None]) -> int:
    from h5forge.demo import synth_photo

    seed, i, path, size = args
    rng = np.random.default_rng([seed, i])
    h, w = size or _SHAPES[int(rng.integers(0, len(_SHAPES)))]
    _grain(synth_photo(rng, h, w), rng).save(path, "JPEG", quality=90)
    return os.path.getsize(path)


def ensure_photoset(
    *, count: int = 2000, seed: int = 0, size: tuple[int, int] | None = None
) -> Path:
    """Return the folder of the set, generating it first if it is not complete.

    ``size=(H, W)`` makes every image that size (small sets for the scaling benchmarks);
    ``None`` draws the photo-like shapes above.
    """
    name = f"photoset-v2-{count}-{seed}" + (f"-{size[0]}x{size[1]}" if size else "")
    root = DATA / name
    if (root / ".complete").exists():
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    jobs = []
    for i in range(count):
        folder = tmp / f"class{i % CLASSES:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((seed, i, str(folder / f"{i:06d}.jpg"), size))
    print(f"generating {count} JPEGs in {root} ...", flush=True)
    with ProcessPoolExecutor() as pool:
        total = sum(pool.map(_one, jobs, chunksize=16))
    (tmp / ".complete").write_text(f"{count} files, {total} bytes\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


def image_files(root: Path) -> list[Path]:
    """Every image file below ``root``, sorted (the order the benchmarks use)."""
    from h5forge.discover.catalog import IMAGE_EXTENSIONS

    return sorted(
        p
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file() and not p.name.startswith(".")
    )


def describe(root: Path, *, generated: bool) -> str:
    files = image_files(root)
    size = sum(p.stat().st_size for p in files)
    sample = [Image.open(p).size for p in files[:: max(1, len(files) // 50)]]
    w = int(np.median([s[0] for s in sample])) if sample else 0
    h = int(np.median([s[1] for s in sample])) if sample else 0
    what = (
        "generated photo set (synth_photo + grain, JPEG q90)"
        if generated
        else f"image folder {root}"
    )
    mean = size / max(1, len(files)) / 1e3
    return (
        f"{what}: {len(files)} files, {size / 1e6:.1f} MB, mean {mean:.1f} KB, median size {w}x{h}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    root = ensure_photoset(count=args.count, seed=args.seed)
    print(root)
    print(describe(root, generated=True))


if __name__ == "__main__":
    main()

"""Real camera photos for the benchmarks, from the sample images that installed packages ship.

No sample-photo collection can be downloaded here, so the photos come from the files inside
the wheels of ``scikit-image`` (``skimage/data``), ``scikit-learn`` (``sklearn/datasets/images``)
and ``matplotlib`` (``mpl-data/sample_data``), read from the installed package folder (nothing
is fetched at run time; the packages are not even imported). Only real photographs are taken:
no drawings, charts, logos or synthetic test patterns. A package that is not installed is left
out, and :func:`describe` says which photos were used.

Each photo is written as 32 JPEGs (quality 75, 85, 90 and 95; 4:2:0 and, at 95 mirrored,
4:4:4 chroma; longer side 400, 500 like most of ImageNet, 640, and the photo's own size;
mirrored or not), so the set has the sizes and qualities of real photo collections. Grey
photos stay grey JPEGs. The
folder is ``benchmarks/data/realphotos-v2-<n>/<photo>/<variant>.jpg`` (git-ignored, never
committed), written once and reused.

    python -m benchmarks.bench_decode --images "$(python -m benchmarks.realphotos)"
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from PIL import Image, ImageOps

from benchmarks.photoset import DATA

# (package, folder inside it, file): the real photographs among the bundled samples.
PHOTOS: tuple[tuple[str, str, str], ...] = (
    ("skimage", "data", "astronaut.png"),
    ("skimage", "data", "chelsea.png"),
    ("skimage", "data", "coffee.png"),
    ("skimage", "data", "motorcycle_left.png"),
    ("skimage", "data", "motorcycle_right.png"),
    ("skimage", "data", "rocket.jpg"),
    ("skimage", "data", "camera.png"),
    ("skimage", "data", "coins.png"),
    ("skimage", "data", "moon.png"),
    ("skimage", "data", "brick.png"),
    ("skimage", "data", "grass.png"),
    ("skimage", "data", "gravel.png"),
    ("skimage", "data", "hubble_deep_field.jpg"),
    ("skimage", "data", "retina.jpg"),
    ("skimage", "data", "ihc.png"),
    ("sklearn", "datasets/images", "china.jpg"),
    ("sklearn", "datasets/images", "flower.jpg"),
    ("matplotlib", "mpl-data/sample_data", "grace_hopper.jpg"),
)
_VERSION = "v2"
# (longer side or None for the photo's own, quality, subsampling (0 = 4:4:4, 2 = 4:2:0), mirror)
_VARIANTS = tuple(
    (side, quality, 0 if quality == 95 and mirror else 2, mirror)
    for side in (400, 500, 640, None)
    for quality in (75, 85, 90, 95)
    for mirror in (False, True)
)


def bundled_photos() -> list[Path]:
    """The files of :data:`PHOTOS` that the installed packages hold (their folder is found
    without importing them)."""
    found = []
    for package, folder, name in PHOTOS:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        path = Path(next(iter(spec.submodule_search_locations))) / folder / name
        if path.is_file():
            found.append(path)
    return found


def ensure_realphotos() -> Path:
    """The folder of the set, written first if it is not complete.

    Raises:
        SystemExit: none of the packages that ship the photos is installed.
    """
    sources = bundled_photos()
    if not sources:
        raise SystemExit(
            "no bundled photos found: pip install scikit-image (and scikit-learn, matplotlib "
            "for three more)"
        )
    names = ",".join(p.name for p in sources)
    root = DATA / f"realphotos-{_VERSION}-{len(sources)}"
    marker = root / ".complete"
    if marker.exists() and marker.read_text().startswith(names):
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    count = 0
    for src in sources:
        with Image.open(src) as im:
            photo = im.convert("L" if im.mode in ("L", "I;16") else "RGB")
        folder = tmp / src.stem
        folder.mkdir(parents=True)
        for side, quality, subsampling, mirror in _VARIANTS:
            img = ImageOps.mirror(photo) if mirror else photo
            if side is not None and max(img.size) != side:
                scale = side / max(img.size)
                size = (round(img.width * scale), round(img.height * scale))
                img = img.resize(size, Image.Resampling.LANCZOS)
            name = f"{side or 'own'}-q{quality}-{'444' if subsampling == 0 else '420'}"
            img.save(
                folder / f"{name}{'-mirror' if mirror else ''}.jpg",
                "JPEG",
                quality=quality,
                subsampling=subsampling,
            )
            count += 1
    (tmp / ".complete").write_text(f"{names}\n{count} files\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return root


def describe_sources() -> str:
    """One line naming the photos used and the packages they came from."""
    by_package: dict[str, list[str]] = {}
    for path in bundled_photos():
        package = next(p for p, _, n in PHOTOS if n == path.name)
        by_package.setdefault(package, []).append(path.stem)
    parts = [f"{pkg}: {', '.join(names)}" for pkg, names in by_package.items()]
    return (
        f"{sum(len(v) for v in by_package.values())} real photos bundled in installed wheels "
        f"({'; '.join(parts)}), each written as {len(_VARIANTS)} JPEGs (q75/85/90/95, longer side "
        "400/500/640/own, mirrored or not, 4:2:0 and 4:4:4)"
    )


def main() -> None:
    root = ensure_realphotos()
    print(describe_sources(), file=sys.stderr)
    print(root)  # alone on stdout: --images "$(python -m benchmarks.realphotos)"


if __name__ == "__main__":
    main()

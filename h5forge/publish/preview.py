"""A labelled grid of sample images from an h5forge file, as PNG, published beside the asset."""

from __future__ import annotations

import contextlib
import io
import math
import os
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from h5forge.errors import PreviewPublishError
from h5forge.files import replace_file
from h5forge.location import Location
from h5forge.messages import describe_os_error
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.publish.overlay import draw_targets
from h5forge.publish.storage import PublishResult
from h5forge.redact import redact_url

__all__ = ["PREVIEW_SUFFIX", "preview_url", "publish_preview", "render_preview", "write_preview"]

PREVIEW_SUFFIX = ".preview.png"

_LABEL_H = 14


def render_preview(
    where: Location, *, n: int = 16, tile: int = 96, max_pixels: int = DEFAULT_MAX_PIXELS
) -> Image.Image:
    """Render ``n`` evenly spaced samples of the file at ``where`` as a grid, each captioned with
    its class, with its boxes and masks drawn on (:func:`h5forge.publish.overlay.draw_targets`).
    ``max_pixels`` is the reader's decode bound (a build passes its ``max_image_pixels``).

    Raises:
        ValueError: ``n`` or ``tile`` is not positive.
    """
    from h5forge.read.dataset import H5ImageDataset

    if n < 1 or tile < 8:
        raise ValueError(f"n={n} must be >= 1 and tile={tile} >= 8")
    ds = H5ImageDataset(where, max_pixels=max_pixels)
    schema = ds.schema
    drawn = [c.name for c in schema if c.kind in ("boxes", "mask")]
    if drawn:  # read them with the images, and draw them on (at the stored size)
        ds.close()
        ds = H5ImageDataset(where, target=["class", *drawn], max_pixels=max_pixels)
    try:
        count = min(n, len(ds))
        picks = np.linspace(0, len(ds) - 1, count).round().astype(int).tolist() if count else []
        cols = max(1, math.ceil(math.sqrt(count)))
        rows = max(1, math.ceil(count / cols))
        grid = Image.new("RGB", (cols * tile, rows * (tile + _LABEL_H)), "white")
        draw = ImageDraw.Draw(grid)
        for k, (img, target) in enumerate(ds.__getitems__(picks)):
            arr = np.asarray(img.permute(1, 2, 0))
            pic = Image.fromarray(arr[:, :, 0] if arr.shape[2] == 1 else arr).convert("RGB")
            label = target["class"] if drawn else target
            if drawn:
                pic = draw_targets(pic, target, schema)
            pic.thumbnail((tile, tile))
            x, y = (k % cols) * tile, (k // cols) * (tile + _LABEL_H)
            grid.paste(pic, (x + (tile - pic.width) // 2, y + (tile - pic.height) // 2))
            draw.text((x + 2, y + tile), ds.classes[int(label)][:16], fill="black")
        return grid
    finally:
        ds.close()


def write_preview(
    url: str | os.PathLike[str] | Location,
    png_url: str | os.PathLike[str] | Location,
    *,
    n: int = 16,
    tile: int = 96,
    storage_options: dict[str, Any] | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> str:
    """Write :func:`render_preview` of the file at ``url`` as PNG to ``png_url``.

    A local ``png_url`` is written under a fresh exclusive temp name and renamed over it, so
    a symlink planted at the name is replaced, never written through.

    Args:
        url: the h5forge file (local path, fsspec URL or :class:`~h5forge.location.Location`).
        png_url: where the PNG goes (local path, fsspec URL or ``Location``).
        storage_options: passed to fsspec with each URL string; never recorded.
        max_pixels: the reader's decode bound, as for :func:`render_preview`.

    Returns:
        ``png_url``'s URL.
    """
    buf = io.BytesIO()
    render_preview(Location.of(url, storage_options), n=n, tile=tile, max_pixels=max_pixels).save(
        buf, "PNG"
    )
    out = Location.of(png_url, storage_options)
    if out.is_local:
        replace_file(out.path, buf.getvalue(), 0o644)
    else:
        out.fs.pipe_file(out.path, buf.getvalue())
    return out.url


def preview_url(dest: str) -> str:
    """The preview PNG's URL: the destination plus ``.preview.png``, beside the sidecar."""
    return dest + PREVIEW_SUFFIX


def publish_preview(
    png: str | os.PathLike[str], dest: Location, *, published: PublishResult
) -> str:
    """Upload the rendered preview ``png`` beside the asset just published at ``dest``.

    At a local destination it is written under a temp name and renamed, so a link planted at
    the name is replaced. A failed upload leaves no torn PNG behind.

    Args:
        png: the local PNG (from :func:`write_preview`).
        dest: the asset, as given to :func:`h5forge.publish.storage.publish`.
        published: what that publish did (named in the error).

    Returns:
        The preview's URL, redacted.

    Raises:
        PreviewPublishError: the upload failed; the message says the asset and its sidecar
            were published (the cause is ``__cause__``).
    """
    url = preview_url(dest.url)
    where = dest.with_url(url)
    try:
        where.put(local=png)
    except OSError as e:
        with contextlib.suppress(OSError):
            where.fs.rm_file(where.path)
        raise PreviewPublishError(
            f"{redact_url(published.url)} and its sidecar were published; only the preview "
            f"{redact_url(url)} could not be written: {describe_os_error(e)}",
            url=redact_url(published.url),
            sidecar_url=redact_url(published.sidecar_url),
            preview_url=redact_url(url),
        ) from e
    return redact_url(url)

"""``ImageConfig``: how every image of one file is decoded, normalised, resized and stored.

One frozen object, passed whole from the flow's form to the workers, that validates,
serialises (:meth:`ImageConfig.to_json`) and compares itself. Its bounds and messages are the
pack options' (:mod:`h5forge.options`), shared with the command line and the build form. The
rules it selects are those of :mod:`h5forge.preprocess.decode`. Light to import: no numpy, no
Pillow.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from h5forge import options as opts
from h5forge.documents import parse_json
from h5forge.options import Encoding, Layout, Mode, ResizePolicy

__all__ = ["DECODERS", "DEFAULT_MAX_PIXELS", "RESAMPLERS", "Decoder", "ImageConfig", "Resample"]

#: Which library decodes a JPEG (other formats are always Pillow's): ``"simplejpeg"``
#: (libjpeg-turbo through simplejpeg: accurate integer DCT, smooth chroma upsampling, DCT
#: scaling by Pillow's rule) or ``"pillow"``.
Decoder = Literal["simplejpeg", "pillow"]
#: Which antialiased bilinear resize (the filter of torchvision's ``Resize`` on PIL images and
#: on tensors): ``"torch"`` (torch's uint8 kernel, SIMD) or ``"pillow"``.
Resample = Literal["torch", "pillow"]
DECODERS: tuple[str, ...] = get_args(Decoder)
RESAMPLERS: tuple[str, ...] = get_args(Resample)
# The values of the fields added after files were first written: a configuration that has them
# serialises without them (so it hashes as the files written before they existed, whose
# pixels it reproduces), and JSON without them reads back as them.
_LEGACY: dict[str, str] = {"decoder": "pillow", "resample": "pillow"}

#: Pillow's own decompression-bomb limit: the default most pixels one image may decode to, in
#: packing (``ImageConfig.max_image_pixels``) and in reading (``max_pixels=`` of
#: :func:`~h5forge.preprocess.images.decode_stored`, ``H5ImageDataset`` and ``verify``).
#: 89.5 M pixels is 268 MB of RGB.
DEFAULT_MAX_PIXELS: int = opts.option("max_image_pixels").default


@dataclass(frozen=True)
class ImageConfig:
    """How every image of one file is decoded, normalised, resized and stored.

    Attributes:
        layout: ``"decoded"`` stores raw ``(H, W, C)`` uint8 pixels; ``"encoded"`` stores bytes.
        encoding: for ``"encoded"`` only: ``"original"`` keeps the source file bit for bit (the
            resize policy then does not apply to the stored bytes), or re-encode as
            ``"jpeg"``/``"png"``/``"webp"`` after normalising and resizing.
        quality: JPEG/WebP re-encode quality, 1..100.
        mode: ``"RGB"`` (C=3) or ``"L"`` (C=1).
        resize: ``"none"``, ``"resize"`` (exactly ``size``) or ``"shorter-side"``.
        size: ``(H, W)`` output size; ``None`` only with ``resize="none"`` (ignored there).
        shorter_side: S for ``"shorter-side"``; ``None`` means ``max(size)``; must be
            ``>= max(size)`` so the centre crop always fits.
        max_image_pixels: images with more pixels (from the header) are quarantined.
        decoder: the JPEG decoder (:data:`Decoder`); a JPEG it cannot take (CMYK/YCCK, or
            data it refuses) is decoded by Pillow, per image. Part of the stored pixels, so of
            the configuration's hash.
        resample: the resize kernel (:data:`Resample`), for every format. Also part of the
            hash. ``decoder="pillow", resample="pillow"`` is the pack before these options,
            pixel for pixel and hash for hash.
    """

    layout: Layout = "decoded"
    encoding: Encoding = "original"
    quality: int = 90
    mode: Mode = "RGB"
    resize: ResizePolicy = "shorter-side"
    size: tuple[int, int] | None = (224, 224)
    shorter_side: int | None = None
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    decoder: Decoder = "simplejpeg"
    resample: Resample = "torch"

    def __post_init__(self) -> None:
        if isinstance(self.size, list):  # e.g. from JSON
            object.__setattr__(self, "size", tuple(self.size))
        self.validate()

    def validate(self) -> None:
        """Check every field.

        Raises:
            ValueError: naming the field, the value found, what is allowed and the fix.
        """
        # The bounds and their messages are the pack options' (h5forge.options), shared
        # with the command line and the build form.
        for name in ("layout", "encoding", "mode", "resize", "quality", "max_image_pixels"):
            opts.option(name).check(getattr(self, name))
        if self.layout == "decoded" and self.encoding != "original":
            raise ValueError(
                f"encoding={self.encoding!r} only applies to layout='encoded'; "
                "set layout='encoded' or leave encoding='original'"
            )
        opts.check_size(self.size, self.resize)
        for name, allowed in (("decoder", DECODERS), ("resample", RESAMPLERS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}; "
                    f"leave the default {allowed[0]!r}, or pick 'pillow' for the pixels of "
                    "packs made before this option existed"
                )
        if self.shorter_side is not None:
            opts.option("shorter_side").check(self.shorter_side)
            least = max(self.size) if self.size else 1
            if self.shorter_side < least:
                raise ValueError(
                    f"shorter_side={self.shorter_side!r} must be an int >= max(size) = {least} "
                    "so the centre crop fits; raise it or leave it None"
                )

    def to_dict(self) -> dict[str, Any]:
        """The fields, less ``decoder``/``resample`` where they are ``"pillow"`` (see
        :meth:`to_json`)."""
        out = dataclasses.asdict(self)
        for name, legacy in _LEGACY.items():
            if out[name] == legacy:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ImageConfig:
        """Inverse of :meth:`to_dict`: a missing ``decoder``/``resample`` is ``"pillow"``.

        ``data`` may come from a file (the ``config_json`` attribute): anything but an object
        of the fields is refused here, as the fields' values are by :meth:`validate`.

        Raises:
            ValueError: not a dict, an unknown field, or a value :meth:`validate` refuses.
        """
        if not isinstance(data, dict):
            raise ValueError(
                f"image configuration {data!r:.80} is not an object of the fields "
                f"{', '.join(_FIELDS)}; write it with ImageConfig.to_json()"
            )
        unknown = sorted(str(k) for k in data if k not in _FIELDS)
        if unknown:
            raise ValueError(
                f"image configuration has unknown fields {unknown}; the fields are "
                f"{', '.join(_FIELDS)} (was it written by a newer h5forge? upgrade it)"
            )
        return cls(**{**_LEGACY, **data})

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): equal configs give equal strings.

        ``decoder`` and ``resample`` are left out where they are ``"pillow"``: the JSON, and
        so the hash, of the Pillow path is that of files packed before the options existed.
        """
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ImageConfig:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: not JSON (a :class:`~h5forge.documents.DocumentError`), or as
                :meth:`from_dict`.
        """
        return cls.from_dict(parse_json(text, what="image configuration", name="image"))


_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ImageConfig))

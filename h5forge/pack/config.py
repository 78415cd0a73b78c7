"""``PackConfig``: what decides the stored bytes of a pack, as one frozen, self-checking value.

The image policy (:class:`~h5forge.preprocess.images.ImageConfig`), the HDF5 codec and its
level, and the per-chunk checksum travel together from the build form
(:meth:`h5forge.flows.config.BuildConfig.pack_config`) or the command line to the writer, the part
packer and the merge. The value validates itself when it is made (the rules and messages of
:mod:`h5forge.options`), serialises itself (:meth:`PackConfig.to_json`, the ``config_json``
root attribute of every file), reads itself back (:meth:`PackConfig.from_json`), hashes itself
(:meth:`PackConfig.sha256`, the ``config_sha256`` attribute and a part sidecar's
``config_sha256``), and gives the ``create_dataset`` filter options of ``/images``
(:meth:`PackConfig.filter_kwargs`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, get_args

from h5forge.documents import DocumentError, parse_json
from h5forge.errors import MissingExtraError
from h5forge.options import CODEC_LEVELS, Compression, OptionError, check_compression
from h5forge.preprocess.config import ImageConfig

__all__ = ["COMPRESSIONS", "PackConfig"]

#: Every codec name :attr:`PackConfig.compression` accepts.
COMPRESSIONS: tuple[str, ...] = get_args(Compression)


@dataclass(frozen=True)
class PackConfig:
    """The image policy, codec and checksums of one pack; checked when made.

    Attributes:
        image: decoding, resizing and storage of every image (default decoded RGB 224x224).
        compression: ``none`` (default; ``None`` is taken as ``none``), ``gzip``, ``lzf``,
            ``blosc-lz4`` or ``zstd`` (the last two need ``hdf5plugin``); decoded fixed-size
            layout only.
        compression_level: the codec's level, or None for its default (see
            :data:`h5forge.options.CODEC_LEVELS`).
        fletcher32: an HDF5 Fletcher-32 checksum per chunk (decoded fixed-size layout only).

    Raises:
        OptionError: a bad image option, codec, level, or a filter on blob storage (the
            messages of :mod:`h5forge.options`, as the command line and the build form give).
    """

    image: ImageConfig = field(default_factory=ImageConfig)
    compression: Compression = "none"
    compression_level: int | None = None
    fletcher32: bool = False

    def __post_init__(self) -> None:
        if self.compression is None:
            object.__setattr__(self, "compression", "none")
        if not isinstance(self.image, ImageConfig):
            raise OptionError("image", f"image={self.image!r} must be an ImageConfig")
        self.image.validate()
        check_compression(
            self.compression, self.compression_level, fixed_size_decoded=self.fixed_size
        )
        if not isinstance(self.fletcher32, bool):
            raise OptionError("fletcher32", f"fletcher32={self.fletcher32!r} must be true or false")
        if self.fletcher32 and not self.fixed_size:
            raise OptionError(
                "fletcher32",
                "fletcher32=True applies to decoded images of one size only (layout "
                "'decoded' and resize other than 'none'); blob storage stays unfiltered so "
                "each sample is one byte range",
            )

    @property
    def fixed_size(self) -> bool:
        """Decoded pixels of one size: stored as one chunk per sample (``array`` storage)."""
        return self.image.layout == "decoded" and self.image.resize != "none"

    @property
    def compression_attr(self) -> str:
        """The ``compression`` root attribute: ``gzip-1``, ``lzf``, ``none+fletcher32``..."""
        name: str = self.compression
        if name != "none" and self.compression_level is not None:
            name = f"{name}-{self.compression_level}"
        return name + ("+fletcher32" if self.fletcher32 else "")

    def to_json(self) -> str:
        """The ``config_json`` root attribute: canonical JSON (sorted keys, no spaces)."""
        return json.dumps(
            {
                "image": self.image.to_dict(),
                "compression": self.compression,
                "compression_level": self.compression_level,
                "fletcher32": self.fletcher32,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> PackConfig:
        """Inverse of :meth:`to_json` (the ``config_json`` attribute of a file).

        Raises:
            ValueError: not that JSON, or a value the options refuse.
        """
        try:
            data = parse_json(text, what="config_json attribute", name="config_json")
            return cls(
                image=ImageConfig.from_dict(data["image"]),
                compression=data["compression"],
                compression_level=data["compression_level"],
                fletcher32=data["fletcher32"],
            )
        except (DocumentError, KeyError, TypeError) as e:
            raise ValueError(f"config_json {text[:200]!r} is not a pack configuration: {e}") from e

    def sha256(self) -> str:
        """sha256 hex of :meth:`to_json`: the ``config_sha256`` attribute and part sidecars'."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    def filter_kwargs(self) -> dict[str, Any]:
        """The ``create_dataset`` filter options of ``/images`` (``{}``: no filter).

        Raises:
            MissingExtraError: ``blosc-lz4`` or ``zstd`` without the package ``hdf5plugin``.
        """
        name = self.compression
        kwargs: dict[str, Any] = {"fletcher32": True} if self.fletcher32 else {}
        if name == "none":
            return kwargs
        if name == "lzf":
            return {**kwargs, "compression": "lzf"}
        level = CODEC_LEVELS[name][2] if self.compression_level is None else self.compression_level
        if name == "gzip":
            return {**kwargs, "compression": "gzip", "compression_opts": level}
        try:
            import hdf5plugin
        except ImportError as e:
            raise MissingExtraError(
                f"compression {name!r} needs the optional package hdf5plugin: "
                "pip install 'h5forge[plugins]'"
            ) from e
        if name == "blosc-lz4":
            return {
                **kwargs,
                **hdf5plugin.Blosc(cname="lz4", clevel=level, shuffle=hdf5plugin.Blosc.SHUFFLE),
            }
        return {**kwargs, **hdf5plugin.Zstd(clevel=level)}

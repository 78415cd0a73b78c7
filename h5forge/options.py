"""The pack options, each defined once: name, type, default, bounds, help, and the checks.

``h5forge pack``, ``h5forge build``, ``BuildConfig`` (the UI form) and the library
(:class:`h5forge.preprocess.images.ImageConfig`, :class:`h5forge.pack.config.PackConfig`) all
take these options; the Typer options and the pydantic fields are derived from
:data:`PACK_OPTIONS`, and every one of them refuses a bad value with the message of
:meth:`PackOption.check`, so a value means the same thing, and is refused with the same words,
wherever it is given.

What one option is and how a value is checked (:class:`PackOption`, :class:`OptionError`, the
``--size`` grammar) comes first; then the options themselves (:data:`PACK_OPTIONS`); then the
rules between them: codec levels (:func:`check_compression`) and the source layouts
(:func:`check_sources`), checked at configuration time, before any work.

No Prefect, no heavy imports: the command line validates its arguments with this module before
it starts anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = [
    "CODEC_LEVELS",
    "PACK_OPTIONS",
    "RENAMED_OPTIONS",
    "SIZE_MAX",
    "SIZE_MIN",
    "Compression",
    "Encoding",
    "Kind",
    "Layout",
    "Mode",
    "OptionError",
    "PackOption",
    "ResizePolicy",
    "check_compression",
    "check_size",
    "check_sources",
    "format_size",
    "option",
    "parse_size",
    "renamed_message",
]


# One option and its checks; the --size grammar

#: Output height and width, in pixels: below 8 nothing is recognisable, above 4096 one decoded
#: RGB sample is 48 MiB, past what a DataLoader batch should hold.
SIZE_MIN, SIZE_MAX = 8, 4096
_SIZE = re.compile(r"^\s*(\d{1,9})\s*(?:[xX]\s*(\d{1,9}))?\s*$")


class OptionError(ValueError):
    """A pack option has a value outside its type, choices or bounds.

    Attributes:
        option: the option's name (``quality``); the CLI flag is ``--`` + dashes.
    """

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(message)


Kind = Literal["choice", "int", "float", "bool", "path", "size", "columns"]


@dataclass(frozen=True)
class PackOption:
    """One pack option.

    Attributes:
        name: the Python and pydantic name (``compression_level``); the flag is :attr:`flag`.
        kind: ``choice``, ``int``, ``float``, ``bool``, ``path``, ``size`` (the grammar of
            :func:`parse_size`) or ``columns`` (that of
            :func:`h5forge.targets.schema.parse_columns`, given as text).
        default: the default value (``None``: empty, the library decides).
        help: one line for ``--help``.
        description: the longer text the UI form shows under the field.
        choices: the allowed values of a ``choice``.
        low, high: inclusive bounds of an ``int`` or ``float`` (``None``: unbounded).
        optional: ``None`` is allowed (an empty form field).
    """

    name: str
    kind: Kind
    default: Any
    help: str
    description: str
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    optional: bool = False

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--compression-level``."""
        return "--" + self.name.replace("_", "-")

    @property
    def bounds(self) -> str:
        """The allowed values in words: ``in 1..100``, ``'RGB', 'L'``, ``>= 1``."""
        if self.kind == "choice":
            return ", ".join(map(repr, self.choices))
        if self.low is not None and self.high is not None:
            return f"in {self.low:g}..{self.high:g}"
        return f">= {self.low:g}" if self.low is not None else "of any value"

    def check(self, value: Any) -> Any:
        """Return ``value`` when this option allows it.

        Raises:
            OptionError: naming the option, the value found, what is allowed and the default.
        """
        if value is None and self.optional:
            return None
        if self.kind == "choice":
            if value not in self.choices:
                raise OptionError(self.name, f"{self.name}={value!r} is not one of {self.bounds}")
            return value
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise OptionError(self.name, f"{self.name}={value!r} must be true or false")
            return value
        if self.kind == "path":
            if value == "" and self.optional:
                return None  # an empty form field or an empty flag: not given
            if not isinstance(value, str) or not value.strip() or "\x00" in value:
                raise OptionError(self.name, f"{self.name}={value!r} must be a non-empty path")
            return value
        if self.kind == "size":
            return check_size(value)
        if self.kind == "columns":
            if value == "" and self.optional:
                return None
            from h5forge.targets.schema import parse_columns

            try:
                parse_columns(value) if isinstance(value, str) else parse_columns("")
            except ValueError as e:
                raise OptionError(self.name, f"{self.name}={value!r}: {e}") from None
            return value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.kind == "int":
            number = number and isinstance(value, int)
        in_range = (
            number
            and (self.low is None or value >= self.low)
            and (self.high is None or value <= self.high)
        )
        if not in_range:
            what = "an int" if self.kind == "int" else "a number"
            hint = (
                " or empty for the default"
                if self.default is None
                else f" (default {self.default!r})"
            )
            raise OptionError(
                self.name, f"{self.name}={value!r} must be {what} {self.bounds}{hint}"
            )
        return value


def format_size(size: tuple[int, int] | None) -> str:
    """``(224, 224)`` -> ``224``, ``(224, 256)`` -> ``224x256``, ``None`` -> ``none``."""
    if size is None:
        return "none"
    h, w = size
    return str(h) if h == w else f"{h}x{w}"


def check_size(size: Any, resize: str | None = None) -> tuple[int, int] | None:
    """Check an output size ``(H, W)`` (or ``None``) against the bounds and ``resize``.

    Raises:
        OptionError: a dimension outside ``SIZE_MIN..SIZE_MAX``, or ``None`` while ``resize``
            is not ``"none"``.
    """
    if size is None:
        if resize is not None and resize != "none":
            raise OptionError(
                "size",
                f"size=None needs resize='none' (size none keeps each "
                f"image's size), got resize={resize!r}; give a size such as 224 "
                "or 224x256, or set resize to 'none'",
            )
        return None
    if (
        not isinstance(size, tuple)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in size)
    ):
        raise OptionError("size", f"size={size!r} must be (H, W), two ints, or None")
    if not all(SIZE_MIN <= v <= SIZE_MAX for v in size):
        raise OptionError(
            "size",
            f"size {format_size(size)} is out of range: height and width "
            f"must be {SIZE_MIN}..{SIZE_MAX} pixels (e.g. 224 or 224x256)",
        )
    return size


_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}  # fmt: skip


def parse_bytes(text: object, what: str) -> int:
    """A number of bytes from an int or a text such as ``64MiB``, ``1 GiB``, ``500MB``,
    ``67108864``.

    Raises:
        ValueError: anything else, naming ``what``, the value and the accepted form.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    match = re.fullmatch(r"\s*(\d{1,16})\s*([a-zA-Z]{0,3})\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{what}={str(text)[:40]!r} is not a size: give bytes, or a number with a unit "
            "(KiB, MiB, GiB, TiB; KB, MB, GB, TB), e.g. 64MiB"
        )
    return int(match.group(1)) * _UNITS[unit]


def parse_size(text: str, resize: str | None = None) -> tuple[int, int] | None:
    """Parse the ``--size`` grammar: ``S`` (square), ``HxW``, or ``none``; then check it.

    Raises:
        OptionError: not that grammar, or out of bounds (see :func:`check_size`).
    """
    if text.strip().lower() == "none":
        return check_size(None, resize)
    match = _SIZE.match(text)
    if not match:
        raise OptionError("size", f"size {text!r} is not S, HxW or none (e.g. 224, 224x256, none)")
    h = int(match.group(1))
    return check_size((h, int(match.group(2) or h)), resize)


# The options

Layout = Literal["decoded", "encoded"]
Encoding = Literal["original", "jpeg", "png", "webp"]
ResizePolicy = Literal["none", "resize", "shorter-side"]
Mode = Literal["RGB", "L"]
Compression = Literal["none", "gzip", "lzf", "blosc-lz4", "zstd"]

#: ``codec -> (lowest level, highest level, default level)``; codecs not listed take no level.
CODEC_LEVELS: dict[str, tuple[int, int, int]] = {
    "gzip": (0, 9, 4),
    "blosc-lz4": (0, 9, 5),
    "zstd": (1, 22, 3),
}
_DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own decompression-bomb limit


def check_compression(
    compression: str | None, level: int | None, *, fixed_size_decoded: bool = True
) -> None:
    """Check a codec, its level, and that it applies to the layout.

    Args:
        compression: a :data:`Compression` name, or None for ``none``.
        level: the codec level, or None for the codec's default.
        fixed_size_decoded: the layout is decoded pixels of one size (the only layout HDF5
            filters apply to; blob storage stays one byte range per sample).

    Raises:
        OptionError: an unknown codec, a level for a codec that takes none, a level out of
            the codec's range, or compression on a layout it does not apply to.
    """
    codec = option("compression").check(compression or "none")
    if level is not None:
        option("compression_level").check(level)
        if codec not in CODEC_LEVELS:
            raise OptionError(
                "compression_level",
                f"compression_level={level} needs a codec "
                f"that takes a level ({', '.join(CODEC_LEVELS)}); compression "
                f"is {codec!r}: drop the level or choose a codec",
            )
        low, high, _ = CODEC_LEVELS[codec]
        if not low <= level <= high:
            raise OptionError(
                "compression_level",
                f"compression_level={level} is out of range for {codec} ({low}..{high})",
            )
    if codec != "none" and not fixed_size_decoded:
        raise OptionError(
            "compression",
            f"compression={codec!r} applies to decoded images of "
            "one size only (layout 'decoded' and resize other than 'none'); blob "
            "storage stays uncompressed so each sample is one byte range",
        )


def _levels() -> str:
    return ", ".join(f"{c} {lo}-{hi}" for c, (lo, hi, _) in CODEC_LEVELS.items())


#: Every pack option, in the order ``--help`` lists them.
PACK_OPTIONS: tuple[PackOption, ...] = (
    PackOption(
        "listing",
        "path",
        None,
        optional=True,
        help="the sample listing: a CSV or JSONL file of the images as path,label[,split], "
        "relative to the source folder (default: none; the class folders are the labels)",
        description="A sample listing: a CSV (path,label[,split]) or JSONL file of the images, "
        "as a path relative to the source's root (or absolute); empty for the ImageFolder layout "
        "[split/]class/image.jpg.",
    ),
    PackOption(
        "coco",
        "path",
        None,
        optional=True,
        help="a COCO instances JSON, relative to the source folder (default: none)",
        description="A COCO instances JSON, relative to the source's root (the folder of its "
        "file_names) or absolute: each image with its boxes, as a 'boxes' column.",
    ),
    PackOption(
        "coco_masks",
        "bool",
        False,
        help="with --coco: draw each image's polygons and RLE as a 'segmentation' mask",
        description="With coco: also draw each image's segmentation (polygons, RLE) as a "
        "'segmentation' mask column: 1 + class index, 255 crowd, 0 background.",
    ),
    PackOption(
        "masks",
        "path",
        None,
        optional=True,
        help="segmentation: the masks folder beside ROOT/images (same names, .png, class ids "
        "as pixel values) (default: none)",
        description="Segmentation: the masks folder beside images/ in the source's root; "
        "images/a/b.jpg pairs with MASKS/a/b.png (class ids), stored as a 'mask' column.",
    ),
    PackOption(
        "columns",
        "columns",
        None,
        optional=True,
        help="the listing's target columns NAME=KIND,... (multilabel, boxes, mask, text, number) "
        "or none; default: inferred",
        description="The listing's target columns, NAME=KIND,... (multilabel, boxes, mask, "
        "text, number), e.g. tags=multilabel; 'none': no target; empty: inferred.",
    ),
    PackOption(
        "layout",
        "choice",
        "decoded",
        choices=get_args(Layout),
        help="decoded: raw uint8 pixels, nothing to decode at read time (fastest); encoded: "
        "the image files' bytes (smaller, decoded by the reader)",
        description="decoded: raw uint8 pixels, nothing to decode at read time (fastest). "
        "encoded: image file bytes (smaller, decoded by the reader).",
    ),
    PackOption(
        "encoding",
        "choice",
        "original",
        choices=get_args(Encoding),
        help="with --layout encoded: keep each file's bytes (original) or re-encode them",
        description="encoded layout only: keep the original file bytes or re-encode.",
    ),
    PackOption(
        "quality",
        "int",
        90,
        low=1,
        high=100,
        help="JPEG/WebP quality when re-encoding (--encoding jpeg or webp)",
        description="JPEG/WebP re-encode quality, 1-100 (encoded layout with encoding jpeg "
        "or webp).",
    ),
    PackOption(
        "resize",
        "choice",
        "shorter-side",
        choices=get_args(ResizePolicy),
        help="none: keep each image's size; resize: stretch to --size; shorter-side: scale the "
        "shorter side, then centre-crop to --size",
        description="none: keep each image's size; resize: to size x size; shorter-side: "
        "scale the shorter side to size, then centre-crop to size x size.",
    ),
    PackOption(
        "size",
        "size",
        (224, 224),
        help="output size in pixels: S (square, e.g. 224), HxW (e.g. 224x256) or none (with "
        f"--resize none); each side {SIZE_MIN}..{SIZE_MAX}",
        description="Output height and width in pixels.",
    ),
    PackOption(
        "shorter_side",
        "int",
        None,
        low=SIZE_MIN,
        high=SIZE_MAX,
        optional=True,
        help="shorter-side: scale the shorter side to this, then crop (default: max(size))",
        description="shorter-side only: scale the shorter side to this many pixels, then "
        "centre-crop to the size; empty for the larger of height and width.",
    ),
    PackOption(
        "mode",
        "choice",
        "RGB",
        choices=get_args(Mode),
        help="RGB (3 channels) or L (grayscale, 1 channel)",
        description="RGB (3 channels) or L (grayscale, 1 channel).",
    ),
    PackOption(
        "max_image_pixels",
        "int",
        _DEFAULT_MAX_PIXELS,
        low=1,
        help="quarantine images whose header declares more pixels (a decompression-bomb guard)",
        description="Images whose header declares more pixels than this are quarantined "
        "instead of decoded (Pillow's decompression-bomb limit by default).",
    ),
    PackOption(
        "compression",
        "choice",
        "none",
        choices=get_args(Compression),
        help="HDF5 compression of decoded fixed-size images (photos gain 1.0-1.3x and lose most "
        "read speed; blosc-lz4 and zstd need hdf5plugin)",
        description="HDF5 compression of decoded fixed-size images. Off by default: photos "
        "gain 1.0-1.3x and lose most of the read speed. blosc-lz4/zstd need hdf5plugin.",
    ),
    PackOption(
        "compression_level",
        "int",
        None,
        low=0,
        high=22,
        optional=True,
        help=f"codec level ({_levels()}) (default: the codec's own)",
        description=f"Codec level ({_levels()}); empty for the codec's default.",
    ),
    PackOption(
        "fletcher32",
        "bool",
        False,
        help="an HDF5 checksum per chunk of decoded fixed-size images: HDF5 refuses damage",
        description="Store an HDF5 Fletcher-32 checksum with every chunk of decoded "
        "fixed-size images, so HDF5 itself refuses a damaged chunk.",
    ),
    PackOption(
        "workers",
        "int",
        None,
        low=1,
        high=1024,
        optional=True,
        help="processes decoding and resizing images (default: the CPUs this process may use)",
        description="Preprocessing processes; empty for the CPU count.",
    ),
    PackOption(
        "max_bad_fraction",
        "float",
        0.01,
        low=0.0,
        high=1.0,
        help="fail when more than this fraction of the images is undecodable (0.01: 1%)",
        description="Fail when more than this fraction of the images cannot be decoded (they "
        "are quarantined and listed in the report).",
    ),
    PackOption(
        "overwrite",
        "bool",
        False,
        help="replace the destination (and its sidecar) if it exists",
        description="Replace an existing asset at the destination.",
    ),
)

_BY_NAME = {o.name: o for o in PACK_OPTIONS}


def option(name: str) -> PackOption:
    """The pack option called ``name`` (``KeyError`` if there is none)."""
    return _BY_NAME[name]


# Source layouts


def check_sources(
    listing: object, coco: object, masks: object, columns: object, coco_masks: object = False
) -> None:
    """Refuse two source layouts at once, ``columns`` without a listing, or ``coco_masks``
    without ``coco`` (``OptionError``)."""
    given = [(n, v) for n, v in (("listing", listing), ("coco", coco), ("masks", masks)) if v]
    if len(given) > 1:
        raise OptionError(
            given[1][0],
            f"{' and '.join(f'{n}={v!r}' for n, v in given)} name two source layouts; give "
            "one of listing (a CSV/JSONL), coco (a COCO instances JSON) or masks (a folder)",
        )
    if columns is not None and columns != "" and not listing:
        raise OptionError(
            "columns", f"columns={columns!r} describes a sample listing; give listing"
        )
    if coco_masks and not coco:
        raise OptionError(
            "coco_masks", f"coco_masks={coco_masks!r} draws a COCO file's masks; give coco"
        )


# Renamed options

#: Option names an older h5forge used -> the name each has now. "manifest" named the sample
#: listing and "shard" the Dask stage's parts; both words now name parts of a version. A saved
#: deployment, a prefect.yaml or a script that gives an old name fails naming the new one
#: (never silently means something else): :class:`h5forge.flows.config.BuildConfig` and the
#: command line refuse them.
RENAMED_OPTIONS: dict[str, str] = {
    "manifest": "listing",
    "shard_size": "part_size",
    "shard_bytes": "part_bytes",
}


def renamed_message(old: str, new: str) -> str:
    """Why the old option name (or flag) ``old`` is refused, naming the new one."""
    return f"{old} was renamed {new} (same meaning, same values); give {new} instead"

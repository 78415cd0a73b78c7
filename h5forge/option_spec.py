"""One pack option: its kind, bounds and check, and the ``--size`` grammar its size kind uses.

:class:`PackOption` describes one option (:data:`h5forge.options.PACK_OPTIONS` lists them all)
and checks a value against it; :class:`OptionError` is what every surface (the command line,
the build form, the library) raises for a refused value, with the same words. ``--size`` has
one grammar: ``S`` (square), ``HxW`` or ``none`` (keep each image's size, with ``resize
none``); height and width are :data:`SIZE_MIN` .. :data:`SIZE_MAX` pixels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "SIZE_MAX",
    "SIZE_MIN",
    "Kind",
    "OptionError",
    "PackOption",
    "check_size",
    "format_size",
    "parse_size",
]

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

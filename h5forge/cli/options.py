"""The pack options as Typer options: declared once in :mod:`h5forge.options`, given to ``pack``
and ``build`` by :func:`with_pack_options`, and checked with the library's own rules.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import typer

from h5forge.cli.exits import EXIT_USAGE, fail, usage_error
from h5forge.options import (
    PACK_OPTIONS,
    RENAMED_OPTIONS,
    OptionError,
    check_compression,
    check_sources,
    format_size,
    option,
    parse_size,
    renamed_message,
)

__all__ = [
    "AssetName",
    "AssetVersion",
    "check_pack_options",
    "pack_default",
    "pack_flag",
    "renamed_flag",
    "with_pack_options",
]

#: The FILE argument of the commands that read one asset (verify, inspect).
AssetName = Annotated[
    str,
    typer.Argument(
        help="the asset: a path or fsspec URL of a .h5 file, or the name it was built or "
        "published to (DEST.h5, or its base DEST; see --version)",
        show_default=False,
    ),
]
#: ``--version``, the same in every command that reads an asset and as ``version=`` in
#: Python (:func:`h5forge.read.version.resolve_asset`); not ``h5forge --version``.
AssetVersion = Annotated[
    str | None,
    typer.Option(
        "--version",
        metavar="latest|SHA256",
        help="which published version: latest, or the first 16-64 hex digits of its sha256 "
        "(`h5forge versions` lists them); default: FILE itself, or the asset's latest "
        "version when no file has that name",
        show_default=False,
    ),
]

_PANEL = "Pack options (the same in pack, build and the UI form)"


def pack_flag(name: str) -> Any:
    """The Typer option of the pack option ``name``: its flag and help, from h5forge.options.

    Bounds and choices are checked by :func:`check_pack_options` (not by click), so that
    ``pack``, ``build`` and the build form refuse a value with the same message.
    """
    o = option(name)
    if o.kind == "choice":
        return typer.Option(
            o.flag,
            help=o.help,
            metavar="[" + "|".join(o.choices) + "]",
            show_default=True,
            rich_help_panel=_PANEL,
        )
    if o.kind == "bool":
        return typer.Option(f"{o.flag}/--no-{o.flag[2:]}", help=o.help, rich_help_panel=_PANEL)
    if o.kind == "size":
        return typer.Option(o.flag, help=o.help, metavar="S|HxW|none", rich_help_panel=_PANEL)
    shown = f" ({o.bounds})" if o.kind in ("int", "float") else ""
    return typer.Option(o.flag, help=o.help + shown, rich_help_panel=_PANEL)


def check_pack_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """Check command-line pack options with the rules of :mod:`h5forge.options`.

    ``size`` is given as text (``224``, ``224x256``, ``none``) and comes back as ``(H, W)`` or
    None; every other value comes back as given. Exits 2 with the option's message.
    """
    checked = dict(values)
    try:
        for name, value in values.items():
            if name == "size":
                checked[name] = parse_size(value, values.get("resize"))
            else:
                option(name).check(value)
        if "compression" in values:
            fixed = (
                values.get("layout", "decoded") == "decoded"
                and values.get("resize", "shorter-side") != "none"
            )
            check_compression(
                values["compression"], values.get("compression_level"), fixed_size_decoded=fixed
            )
        if "listing" in values:
            names = ("listing", "coco", "masks", "columns", "coco_masks")
            check_sources(*(values.get(k) for k in names))
    except OptionError as e:
        raise usage_error(e) from e
    return checked


def pack_default(name: str) -> Any:
    """The command-line default of the pack option ``name`` (``--size`` as text)."""
    o = option(name)
    return format_size(o.default) if o.kind == "size" else o.default


_PY_TYPES = {
    "choice": str,
    "size": str,
    "path": str,
    "columns": str,
    "int": int,
    "float": float,
    "bool": bool,
}


def renamed_flag(old: str, new: str) -> Any:
    """A hidden option for the flag an older h5forge called ``old`` (now ``new``): given, it
    exits 2 naming ``new`` while the command line is parsed (before anything slow starts)."""

    def refuse(value: object) -> object:
        if value is not None and value is not False:
            raise fail(renamed_message(old, new), EXIT_USAGE)
        return value

    return typer.Option(old, hidden=True, callback=refuse, is_eager=True)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def with_pack_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``command`` every option of :data:`h5forge.options.PACK_OPTIONS` as a Typer option.

    The options are declared once, in :mod:`h5forge.options`; ``pack`` and ``build`` take them
    from there instead of restating them. ``command`` receives them as one dict, its keyword
    ``pack_options`` (name -> value as typed; ``size`` as text), and lists them in ``--help``
    after its own parameters. The old spelling of each of its options that was renamed
    (:data:`h5forge.options.RENAMED_OPTIONS`) is refused, naming the new one.
    """
    # The command's own annotations evaluated in its module (they are strings under
    # ``from __future__ import annotations``): the wrapper lives here, where they would not
    # resolve, and Typer would drop their help.
    hints = typing.get_type_hints(command, include_extras=True)
    own = [
        p.replace(annotation=hints.get(name, p.annotation))
        for name, p in inspect.signature(command).parameters.items()
        if name != "pack_options"
    ]
    added = []
    for o in PACK_OPTIONS:
        kind: Any = _PY_TYPES[o.kind]
        if o.optional:
            kind = kind | None
        added.append(
            inspect.Parameter(
                o.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=pack_default(o.name),
                annotation=Annotated[kind, pack_flag(o.name)],
            )
        )

    names = {p.name for p in own} | {o.name for o in PACK_OPTIONS}
    renamed = [
        inspect.Parameter(
            old,
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=Annotated[str | None, renamed_flag(_flag(old), _flag(new))],
        )
        for old, new in RENAMED_OPTIONS.items()
        if new in names
    ]

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        chosen = {o.name: kwargs.pop(o.name) for o in PACK_OPTIONS}
        for p in renamed:  # None: their callbacks exit when one is given
            kwargs.pop(p.name)
        return command(*args, pack_options=chosen, **kwargs)

    signature = inspect.Signature(
        [*(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own), *added, *renamed]
    )
    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return run

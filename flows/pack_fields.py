"""The pydantic fields of the pack options: defaults, descriptions and bounds from
:data:`h5forge.options.PACK_OPTIONS`, so the build form says what ``h5forge pack`` says."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from h5forge.options import SIZE_MAX, SIZE_MIN, option

__all__ = ["pack_default", "pack_field"]


def pack_default(name: str) -> Any:
    """The default of the pack option ``name``, as the form's field default."""
    return option(name).default


def pack_field(name: str, *, description: str | None = None) -> Any:
    """The pydantic ``Field`` of a pack option: its description, and its bounds in the JSON
    schema (the UI form and the server enforce them; the validators give the message)."""
    o = option(name)
    low, high = (SIZE_MIN, SIZE_MAX) if o.kind == "size" else (o.low, o.high)
    bounds = {k: v for k, v in (("minimum", low), ("maximum", high)) if v is not None}

    def schema(prop: dict[str, Any]) -> None:
        # Where pydantic's ge/le would put them: on the number, also inside ``int | None``.
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") in ("integer", "number"):
                branch.update(bounds)

    return Field(
        description=description or o.description, json_schema_extra=schema if bounds else None
    )

"""The rules between the source-layout pack options (listing, coco, masks, columns,
coco_masks), checked with the others before any work (:mod:`h5forge.options` re-exports
:func:`check_sources`)."""

from __future__ import annotations

from h5forge.option_spec import OptionError

__all__ = ["check_sources"]


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

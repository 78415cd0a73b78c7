"""``ReadOptions``: how an asset is read, as one frozen value.

:class:`~h5forge.read.dataset.H5ImageDataset` and :class:`~h5forge.read.multi.H5MultiDataset`
build one from their keyword arguments (or take it as ``options=``), pickle it whole to their
DataLoader workers, and open each process's state with it
(:func:`h5forge.read.state.open_state`). Where the bytes are (the URL, its storage options and
the pinned version) travels beside it: that is the asset, not a way of reading it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.read.cache import FileCache, default_cache_dir
from h5forge.read.targets import CLASS

__all__ = ["ReadOptions", "pick_options", "with_default_cache"]

log = logging.getLogger("h5forge.read.options")


@dataclass(frozen=True)
class ReadOptions:
    """The reader's options; each field means what the keyword of the same name of
    :class:`~h5forge.read.dataset.H5ImageDataset` means (its docstring says how).

    Checked when made: ``max_pixels`` is an int >= 1; with a ``cache_dir`` folder,
    ``cache_limit`` (when given) is one too and ``cache_dir`` a folder this user can write
    (created if missing). ``cache_dir=None`` (the default) means the default cache for a remote
    asset (:func:`with_default_cache`, applied by the dataset once it knows where the asset
    is); ``False``, no cache. ``target``
    given as a list is kept as a tuple, so the value stays frozen; it still means "a dict per
    sample".

    Attributes:
        cache: the :class:`~h5forge.read.cache.FileCache` of ``cache_dir`` (None without one),
            made here once: pickled with the value, so workers reuse the checks it made.

    Raises:
        ValueError: ``max_pixels``, ``cache_limit`` or ``cache_dir`` is invalid (the message
            says which value and what is allowed).
    """

    split: str | None = None
    target: str | Sequence[str] = CLASS
    multilabel: str = "multihot"
    iscrowd: bool = False
    transform: Callable[[Any], Any] | None = None
    target_transform: Callable[[Any], Any] | None = None
    transforms: Callable[[Any, Any], tuple[Any, Any]] | None = None
    verify_reads: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    cache_dir: str | os.PathLike[str] | bool | None = None
    cache_limit: int | None = None
    cache: FileCache | None = field(init=False, default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        max_pixels = self.max_pixels
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
            raise ValueError(
                f"max_pixels={max_pixels!r} must be an int >= 1 (default {DEFAULT_MAX_PIXELS})"
            )
        if isinstance(self.target, list):
            object.__setattr__(self, "target", tuple(self.target))
        if isinstance(self.cache_dir, (str, os.PathLike)):
            root = os.fspath(self.cache_dir)
            object.__setattr__(self, "cache_dir", root)
            object.__setattr__(self, "cache", FileCache(root, self.cache_limit))
        elif self.cache_dir is not None and self.cache_dir is not False:
            raise ValueError(
                f"cache_dir={self.cache_dir!r:.80} must be a folder, None (the default cache "
                "for remote assets) or False (no cache)"
            )

    @property
    def transformed(self) -> bool:
        """Whether any transform is set (samples then go through them one by one)."""
        return any(t is not None for t in (self.transform, self.target_transform, self.transforms))


def pick_options(options: ReadOptions | None, keywords: ReadOptions) -> ReadOptions:
    """``options`` when given, else ``keywords`` (a constructor's reading keywords as a value).

    Raises:
        ValueError: both were given: ``keywords`` differ from the defaults (naming them).
    """
    if options is None:
        return keywords
    if not isinstance(options, ReadOptions):
        raise ValueError(f"options={options!r:.100} must be a ReadOptions")
    default = ReadOptions()
    given = [
        f"{f.name}={getattr(keywords, f.name)!r:.100}"
        for f in fields(ReadOptions)
        if f.init and getattr(keywords, f.name) != getattr(default, f.name)
    ]
    if given:
        raise ValueError(
            f"options= was given with {', '.join(given)} as well: pass those inside options "
            "(dataclasses.replace(options, ...)), or drop options="
        )
    return options


def with_default_cache(options: ReadOptions, remote: bool) -> ReadOptions:
    """``options`` with the default cache when they leave ``cache_dir`` unset (None) and the
    asset is ``remote``: :func:`~h5forge.read.cache.default_cache_dir`, limited to
    ``cache_limit`` or by default half the free disk space (at most 50 GiB), filled from the
    reader's own fetches (:mod:`h5forge.read.fill`). An asset without a sidecar or pinned version
    is then read uncached. A default folder that cannot be made or written is logged and the
    asset read uncached: the default never stops a read."""
    if not remote or options.cache_dir is not None or options.cache is not None:
        return options
    try:
        cache = FileCache(default_cache_dir(), options.cache_limit, required=False)
    except ValueError as e:
        log.warning("the default read cache cannot be used (%s); reading uncached", e)
        return options
    out = dataclasses.replace(options)
    object.__setattr__(out, "cache", cache)
    return out

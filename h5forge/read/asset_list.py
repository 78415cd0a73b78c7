"""Which assets a multi-asset dataset reads (a list of URLs, or an asset list), and the one
class list they share (:func:`union_classes`).

:class:`H5MultiDataset <h5forge.read.multi.H5MultiDataset>` takes either. A list names each
asset as a URL, a ``(url, version)`` pair or a dict ``{"url": ..., "version": ..., "weight":
...}``. An **asset list** is a small JSON file (read as untrusted input)::

    {"format": "h5forge-shards", "version": 1,
     "assets": [{"url": "s3://bucket/flowers", "version": "latest", "weight": 2.0},
                {"url": "part-0001.h5"}]}

``url`` is required; ``version`` (``"latest"`` or a sha256 prefix, see
:func:`h5forge.publish.versions.parse_version`) and ``weight`` (a finite number in ``(0,
MAX_WEIGHT]``, up to the largest float, default 1; the asset's share in
:class:`h5forge.read.mixing.MixingSampler`) are optional, other keys are refused. A relative
``url`` is relative to the asset list's folder. An asset list is at most
:data:`h5forge.location.MAX_ASSET_LIST_BYTES` and names at most :data:`MAX_ASSETS` assets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from h5forge.location import MAX_ASSET_LIST_BYTES, Location
from h5forge.publish.versions import parse_version
from h5forge.read.mixing import MAX_WEIGHT
from h5forge.read.order import shown
from h5forge.targets.schema import Column
from h5forge.targets.words import describe_columns

__all__ = [
    "ASSET_LIST_FORMAT",
    "MAX_ASSETS",
    "AssetSource",
    "check_same_targets",
    "parse_sources",
    "read_asset_list",
    "union_classes",
]

# An on-disk name from before the asset list had its own word: kept, so old lists still read.
ASSET_LIST_FORMAT = "h5forge-shards"
MAX_ASSETS = 10_000
_MAX_URL_CHARS = 4096
_KEYS = frozenset({"url", "version", "weight"})


@dataclass(frozen=True)
class AssetSource:
    """One asset of a multi-asset dataset: where, which version, and its mixing weight."""

    url: str
    version: str | None = None
    weight: float = 1.0


def _entry(item: object, where: str) -> AssetSource:
    if isinstance(item, (str, os.PathLike)):
        return _checked(os.fspath(item), None, 1.0, where)
    if isinstance(item, tuple) and len(item) == 2:
        return _checked(item[0], item[1], 1.0, where)
    if isinstance(item, Mapping):
        unknown = sorted(str(k) for k in item if k not in _KEYS)
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; allowed: {sorted(_KEYS)}")
        if "url" not in item:
            raise ValueError(f"{where} has no 'url'")
        return _checked(item["url"], item.get("version"), item.get("weight", 1.0), where)
    raise ValueError(
        f"{where} is {type(item).__name__} {item!r:.80}; give a URL, a (url, version) pair or "
        "a dict with 'url' (and optionally 'version', 'weight')"
    )


def _checked(url: object, version: object, weight: object, where: str) -> AssetSource:
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url or len(url) > _MAX_URL_CHARS:
        raise ValueError(
            f"{where}: url {url!r:.80} must be a non-empty string of at most "
            f"{_MAX_URL_CHARS} characters"
        )
    if version is not None:
        try:
            version = parse_version(version)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    # A comparison, not math.isfinite: an int past the largest float (10**400) has no float.
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not 0 < weight <= MAX_WEIGHT
    ):
        raise ValueError(
            f"{where}: weight {shown(weight)} must be a finite number in (0, {MAX_WEIGHT!r}]"
        )
    return AssetSource(url, version, float(weight))


def parse_sources(sources: Sequence[object]) -> list[AssetSource]:
    """The assets of a list: URLs, ``(url, version)`` pairs or dicts (see the module).

    Raises:
        ValueError: the list is empty or longer than :data:`MAX_ASSETS`, or an entry is
            malformed (the message names its position).
    """
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence):
        raise ValueError(
            f"sources must be a list of assets or the URL of an asset list, not "
            f"{type(sources).__name__}"
        )
    if not 1 <= len(sources) <= MAX_ASSETS:
        raise ValueError(f"{len(sources)} assets given; give 1 to {MAX_ASSETS}")
    return [_entry(item, f"sources[{k}]") for k, item in enumerate(sources)]


def _relative_to(listed_in: str, url: str) -> str:
    if "://" in url or url.startswith("/") or "/" not in listed_in:
        return url
    return listed_in.rsplit("/", 1)[0] + "/" + url  # "memory://m.json" -> "memory://" + url


def read_asset_list(where: Location) -> list[AssetSource]:
    """The assets the asset list at ``where`` names, checked (see the module for the format).

    Raises:
        FileNotFoundError: no asset list at ``where``.
        ValueError: the asset list is over :data:`h5forge.location.MAX_ASSET_LIST_BYTES`, not
            JSON, of another format or version, names no asset or more than
            :data:`MAX_ASSETS`, or an entry is malformed; the message names the asset list (and
            the entry).
    """
    shown = str(where)
    # One bounded read: never more than the limit is fetched, whatever the file's size.
    body = where.read_json(limit=MAX_ASSET_LIST_BYTES, what="asset list")
    if not isinstance(body, dict) or body.get("format") != ASSET_LIST_FORMAT:
        raise ValueError(f'{shown} is not an asset list: it needs "format": "{ASSET_LIST_FORMAT}"')
    if body.get("version") != 1:
        raise ValueError(
            f"{shown} has asset list version {body.get('version')!r:.40}; this h5forge reads "
            "version 1: upgrade h5forge"
        )
    assets = body.get("assets")
    if not isinstance(assets, list) or not 1 <= len(assets) <= MAX_ASSETS:
        count = len(assets) if isinstance(assets, list) else type(assets).__name__
        raise ValueError(
            f"{shown}: 'assets' must be a list of 1 to {MAX_ASSETS} assets, not {count}"
        )
    out = []
    for k, item in enumerate(assets):
        if not isinstance(item, dict):
            raise ValueError(f"{shown}: assets[{k}] must be an object with 'url'")
        found = _entry(item, f"{shown}: assets[{k}]")
        out.append(AssetSource(_relative_to(where.url, found.url), found.version, found.weight))
    return out


def union_classes(
    assets: Sequence[tuple[str, Sequence[str]]], *, remap: bool
) -> tuple[list[str], list[np.ndarray | None]]:
    """One class list for several assets, and each asset's label map (None: unchanged).

    Without ``remap`` the assets must agree: a class name has one index in every asset that has
    it, and an index one name; the union is the longest list (the others are its prefixes).
    With ``remap`` the union lists the classes in order of first appearance (asset by asset), so
    the first asset keeps its labels, and every asset whose labels change gets a map.

    Raises:
        ValueError: (without ``remap``) two assets disagree on a class index; names both.
    """
    name_at: dict[int, tuple[str, str]] = {}  # index -> (name, first asset with it)
    index_of: dict[str, tuple[int, str]] = {}  # name -> (index, first asset with it)
    order: list[str] = []
    for url, classes in assets:
        for i, name in enumerate(classes):
            if name not in index_of:
                index_of[name] = (i, url)
                order.append(name)
            if remap:
                continue
            j, first = index_of[name]
            if j != i:
                _disagree(f"class {name!r} is {j} in {first} but {i} in {url}")
            other, first = name_at.setdefault(i, (name, url))
            if other != name:
                _disagree(f"class index {i} is {other!r} in {first} but {name!r} in {url}")
    if not remap:
        return [name_at[i][0] for i in range(len(name_at))], [None] * len(assets)
    pos = {name: k for k, name in enumerate(order)}
    maps: list[np.ndarray | None] = []
    for _, classes in assets:
        lut = np.array([pos[c] for c in classes], dtype=np.int64)
        maps.append(None if np.array_equal(lut, np.arange(len(lut))) else lut)
    return order, maps


def check_same_targets(assets: Sequence[tuple[str, Sequence[Column]]]) -> None:
    """Refuse assets whose target columns differ (names, kinds, classes, dtypes; a mask may
    be raw in one and PNG in another): read as one, a target must mean one thing.

    Raises:
        ValueError: names the first asset that differs from the first one, and both schemas.
    """
    (first_url, first), *rest = assets
    plain = [replace(c, encoding="") for c in first]
    for url, schema in rest:
        mine = [replace(c, encoding="") for c in schema]
        if mine != plain:
            ours, theirs = describe_columns(mine) or "none", describe_columns(plain) or "none"
            names = " (the class names differ)" if ours == theirs else ""
            raise ValueError(
                f"{url} has the target columns {ours}, {first_url} has {theirs}{names}: read "
                "as one, the assets need the same columns (names, kinds and classes); pack "
                "them with one schema, or read them one by one"
            )


def _disagree(what: str) -> None:
    raise ValueError(
        f"{what}: the assets disagree on their class sets; pack them with the same classes, "
        "or pass remap=True to build the union (labels renumbered, see .classes)"
    )

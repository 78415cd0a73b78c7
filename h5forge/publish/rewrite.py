"""Rewrite shards of a sharded asset: compaction, and purge (a takedown of named samples).

Both rewrite a shard by copying the stored bytes of the rows it keeps into a new shard
(:func:`h5forge.pack.writer.pack_slice` with ``reuse``: the stored-copy kernel, each sample's
sha256 checked from the new file; never decoded, so the source is not needed), with each kept
row's target columns as the shard stores them (boxes, masks, labels lists, text, numbers:
:mod:`h5forge.pack.carried`, each value checked against its digest; the new shard has the same
columns, so every shard of a version still reads with one ``target=``), named by its own
sha256 like any shard. Everything else follows the publish order: new shards first, then
new manifests, then the pointer, and only then is anything removed.

- :func:`compact` writes a new latest version whose shards that had fewer than ``below`` of
  their rows live are replaced by shards of their live rows (same samples, same order).
- :func:`purge` removes samples, by source path, from every sharded version under ``v/``: each
  shard holding one is rewritten without it, every version's manifest is written anew (a new
  sha256, so a new version key; parents follow), the pointer moves to the new latest, and the
  old manifests and shards that no version lists any more are deleted. The bytes of a purged
  sample are then in no file of the asset. Pinned readers of an old version lose it: that is
  the point of a takedown.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import tempfile
from collections.abc import Collection
from dataclasses import dataclass, replace

from h5forge.asset import format as fmt
from h5forge.asset.index import check_labels, load_index
from h5forge.asset.open import open_h5
from h5forge.asset.target_layout import file_schema
from h5forge.discover.catalog import Catalog, Sample
from h5forge.errors import IntegrityError
from h5forge.files import create_exclusive
from h5forge.location import MAX_MANIFEST_BYTES, Location
from h5forge.pack.config import PackConfig
from h5forge.pack.reuse import Reuse
from h5forge.publish.manifest import (
    MANIFEST_SUFFIX,
    ShardEntry,
    VersionManifest,
    manifest_bytes,
    parse_manifest,
    read_manifest,
    shard_key,
)
from h5forge.publish.shard_release import upload_shard
from h5forge.publish.sharded import COMPACT_BELOW, texts
from h5forge.publish.versions import (
    KEY_HEX,
    MAX_VERSIONS,
    asset_base,
    check_tree,
    guard_pointer,
    read_pointer,
    version_url,
    write_pointer,
)
from h5forge.redact import redact_url

__all__ = ["RewriteResult", "compact", "purge"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewriteResult:
    """What :func:`compact` or :func:`purge` did.

    Attributes:
        latest: the sha256 of the latest version after it ("" when the asset has none).
        versions: ``(old sha256, new sha256)`` of every version written anew.
        shards_rewritten: ``(old shard sha256, new shard sha256 or "" when nothing was left)``.
        removed_samples: rows dropped (purge: the named samples' rows, live or not).
    """

    latest: str
    versions: tuple[tuple[str, str], ...]
    shards_rewritten: tuple[tuple[str, str], ...]
    removed_samples: int


def _versions(asset: Location) -> list[tuple[str, VersionManifest]]:
    """``(sha256, manifest)`` of every sharded version under ``BASE/v/`` (each manifest's
    bytes hashed: its full sha256 is recomputed, its folder's key must begin it)."""
    base = asset_base(asset.url)
    home = asset.with_url(base)
    name = posixpath.basename(base)
    check_tree(home, "v")
    folder = home.join("v")
    folder.fs.invalidate_cache(folder.path)
    try:
        listed = folder.ask("its listing", "ls", folder.path, detail=False, listed=MAX_VERSIONS)
        keys = sorted(posixpath.basename(p.rstrip("/")) for p in listed)
    except FileNotFoundError:
        return []
    found = []
    for key in keys:
        where = home.join("v", key, name + MANIFEST_SUFFIX)
        if len(key) != KEY_HEX or not where.ask("whether it exists", "exists", where.path):
            continue  # a single-file version, or not h5forge's
        check_tree(home, "v", key, name + MANIFEST_SUFFIX)
        data = where.read_bytes(limit=MAX_MANIFEST_BYTES, what="version manifest")
        sha = hashlib.sha256(data).hexdigest()
        if not sha.startswith(key):
            raise IntegrityError(
                f"{where}: the version manifest hashes to {sha}, not to its key {key}: it was "
                "replaced or damaged; nothing was rewritten"
            )
        found.append((sha, parse_manifest(data, shown=str(where))))
    return found


class _Shards:
    """The local copies of an asset's shards that a rewrite reads, each fetched (when remote)
    and hashed against its address once, however often it is read."""

    def __init__(self, asset: Location, tmp: str) -> None:
        self.asset, self.tmp = asset, tmp
        self._checked: dict[str, str] = {}

    def local(self, entry: ShardEntry) -> str:
        """A local path of ``entry``'s shard, its sha256 checked."""
        if entry.sha256 in self._checked:
            return self._checked[entry.sha256]
        base = asset_base(self.asset.url)
        check_tree(self.asset.with_url(base), *shard_key(entry.sha256).split("/"))
        shard = self.asset.with_url(f"{base}/{shard_key(entry.sha256)}")
        local = shard.path if shard.is_local else os.path.join(self.tmp, f"{entry.sha256}.h5")
        if not shard.is_local:  # bounded in time; exactly the bytes its entry records
            shard.download(create_exclusive(local), size=entry.bytes)
        if Location(local).sha256() != entry.sha256:
            raise IntegrityError(
                f"shard {entry.sha256[:KEY_HEX]} of {redact_url(base)} does not hash to its "
                "address: it was replaced or damaged; nothing was rewritten"
            )
        self._checked[entry.sha256] = local
        return local


def _rewrite(
    shards: _Shards, entry: ShardEntry, keep: list[int], config: PackConfig
) -> tuple[ShardEntry, str] | None:
    """A new shard of ``entry``'s rows ``keep`` (stored bytes copied, checked): its entry
    (labels and splits as the old one's, no deleted rows) and local file; None for no rows."""
    from h5forge.pack.writer import pack_slice

    if not keep:
        return None
    tmp, local = shards.tmp, shards.local(entry)
    where = f"shard {entry.sha256[:KEY_HEX]}"
    with open_h5(Location(local)) as h5:  # its index and target layout checked, then read
        index = load_index(h5, where=where)
        check_labels(index, where=where)
        schema = file_schema(index.header, where=where)
        paths = texts(h5[fmt.PATHS][:])
    labels, splits, names = index.labels, index.split_codes, index.split_names
    rows = [paths[r] for r in keep]
    if len(set(rows)) != len(rows):
        raise IntegrityError(f"shard {entry.sha256[:KEY_HEX]} lists a path twice: not rewritten")
    catalog = Catalog(
        root=tmp,
        samples=tuple(
            Sample(
                path=os.path.join(tmp, "missing", paths[r]),  # never read: every row is copied
                relpath=paths[r],
                label=int(labels[r]),
                split=names[int(splits[r])],
            )  # its target values are carried from the shard (Reuse.targets), as stored
            for r in keep
        ),
        classes=index.classes,
        splits=tuple(n for n in names if n),
        skipped={},
        schema=schema,
    )
    out = os.path.join(tmp, f"new-{entry.sha256[:KEY_HEX]}.h5")
    reuse = Reuse(local, frozenset(rows), targets=True)
    result = pack_slice(catalog, out, config=config, workers=1, shard=True, reuse=reuse)
    if result.reused != len(keep) or result.num_samples != len(keep):
        raise IntegrityError(
            f"rewriting shard {entry.sha256[:KEY_HEX]} copied {result.reused} of {len(keep)} "
            "rows: nothing was published; verify the asset (`h5forge verify`)"
        )
    sha = Location(out).sha256()
    final = os.path.join(tmp, f"{sha}.h5")
    os.replace(out, final)
    counts: dict[str, int] = {}
    for r in keep:
        if names[int(splits[r])]:
            counts[names[int(splits[r])]] = counts.get(names[int(splits[r])], 0) + 1
    with open_h5(Location(final)) as h5:
        meta = str(h5.attrs[fmt.A_METADATA_SHA256])
    new = ShardEntry(
        sha256=sha,
        bytes=os.path.getsize(final),
        metadata_sha256=meta,
        samples=len(keep),
        labels=entry.labels,
        splits=counts,
    )
    return new, final


def _upload(asset: Location, sha: str, local: str) -> None:
    upload_shard(asset.with_url(asset_base(asset.url)), sha, local)


def _write_manifest(
    asset: Location, manifest: VersionManifest, *, was: str, drop: Collection[str] = ()
) -> str:
    """Write ``manifest`` as a version (its sources map first: the one of the version ``was``,
    less the paths ``drop``, so the next build stays incremental); its sha256."""
    from h5forge.publish.lineage import read_sources, write_sources

    data = manifest_bytes(manifest)
    sha = hashlib.sha256(data).hexdigest()
    base = asset_base(asset.url)
    url = version_url(base, sha, "sharded")
    check_tree(asset.with_url(base), *url[len(base) + 1 :].split("/"))
    where = asset.with_url(url)
    sources = read_sources(asset.with_url(version_url(base, was, "sharded")))
    if sources is not None:
        write_sources(where, {p: t for p, t in sources.items() if p not in drop})
    where.put(data=data)
    return sha


def _remove_unlisted(
    asset: Location, old: Collection[str], gone_versions: Collection[str], keep_shards: set[str]
) -> None:
    """Delete the old versions' folders and the old shards no version lists any more."""
    base = asset_base(asset.url)
    home = asset.with_url(base)
    for sha in gone_versions:
        folder = home.join("v", sha[:KEY_HEX])
        check_tree(home, "v", sha[:KEY_HEX])
        for path in folder.ask("its listing", "ls", folder.path, detail=False, listed=16):
            folder.fs.rm_file(path)
        if folder.is_local:
            os.rmdir(folder.path)
    for sha in set(old) - keep_shards:
        check_tree(home, *shard_key(sha).split("/"))
        shard = home.join(*shard_key(sha).split("/"))
        if shard.ask("whether it exists", "exists", shard.path):
            shard.fs.rm_file(shard.path)


def purge(asset: Location, paths: Collection[str]) -> RewriteResult:
    """Remove the samples whose source path is in ``paths`` from every version of ``asset``
    (see the module's doc). Their rows go whether live or already deleted: a deleted row's
    bytes are still in its shard.

    Raises:
        ValueError: ``paths`` is empty, or a version under ``v/`` is a single file that holds
            one of them (a single-file version cannot be purged in place: delete it).
        FileNotFoundError: the asset has no sharded version.
        IntegrityError: a shard does not hash to its address, or a rewrite lost a row.
    """
    from h5forge.publish.versions import asset_lock

    wanted = frozenset(paths)
    if not wanted or not all(isinstance(p, str) and p for p in wanted):
        raise ValueError(f"paths={sorted(wanted)[:5]!r} must name at least one sample's path")
    if read_pointer(asset) is None:  # before the lock, which would make the folder
        raise FileNotFoundError(f"{redact_url(asset_base(asset.url))} has no sharded version")
    with asset_lock(asset), tempfile.TemporaryDirectory(prefix="h5forge-purge-") as tmp:
        versions = _versions(asset)
        if not versions:
            raise FileNotFoundError(f"{redact_url(asset_base(asset.url))} has no sharded version")
        _refuse_single_files(asset, wanted)
        shards = _Shards(asset, tmp)
        new_shards: dict[str, tuple[ShardEntry, str] | None] = {}
        row_maps: dict[str, dict[int, int]] = {}
        removed = 0
        for _, manifest in versions:
            config = PackConfig.from_json(manifest.config_json)
            for entry in manifest.shards:
                if entry.sha256 in new_shards or entry.sha256 in row_maps:
                    continue
                with open_h5(Location(shards.local(entry))) as h5:
                    names = texts(h5[fmt.PATHS][:])
                drop = {r for r, p in enumerate(names) if p in wanted}
                if not drop:
                    row_maps[entry.sha256] = {}
                    continue
                keep = [r for r in range(entry.samples) if r not in drop]
                removed += len(drop)
                new_shards[entry.sha256] = _rewrite(shards, entry, keep, config)
                row_maps[entry.sha256] = {old: new for new, old in enumerate(keep)}
        return _republish(asset, versions, new_shards, row_maps, removed, wanted)


def compact(asset: Location, below: float = COMPACT_BELOW) -> RewriteResult:
    """A new latest version of ``asset`` whose shards with fewer than ``below`` of their rows
    live are rewritten with their live rows only (see the module's doc); the old versions are
    kept as they are (retention removes them as it does any version).

    Raises:
        ValueError: ``below`` is outside [0, 1], or the latest version is not sharded.
        FileNotFoundError: the asset has no version.
    """
    from h5forge.publish.versions import asset_lock

    if not 0.0 <= below <= 1.0:
        raise ValueError(f"below={below!r} must be in [0, 1]")
    if read_pointer(asset) is None:  # before the lock, which would make the folder
        raise FileNotFoundError(f"{redact_url(asset_base(asset.url))} has no version")
    with asset_lock(asset), tempfile.TemporaryDirectory(prefix="h5forge-compact-") as tmp:
        guard = guard_pointer(asset)
        pointer = guard.pointer
        if pointer is None:
            raise FileNotFoundError(f"{redact_url(asset_base(asset.url))} has no version")
        if pointer.kind != "sharded":
            raise ValueError(
                f"the latest version of {redact_url(asset_base(asset.url))} is one file: "
                "there are no shards to compact"
            )
        manifest = read_manifest(asset.with_url(pointer.url), pointer.sha256)
        config = PackConfig.from_json(manifest.config_json)
        shards = _Shards(asset, tmp)
        entries: list[ShardEntry] = []
        rewritten: list[tuple[str, str]] = []
        for entry in manifest.shards:
            if entry.live >= below * entry.samples:
                entries.append(entry)
                continue
            made = _rewrite(shards, entry, entry.live_rows().tolist(), config)
            rewritten.append((entry.sha256, made[0].sha256 if made else ""))
            if made is not None:
                _upload(asset, made[0].sha256, made[1])
                entries.append(made[0])
        if not rewritten:
            return RewriteResult(pointer.sha256, (), (), 0)
        new = replace(manifest, shards=tuple(entries), parent=pointer.sha256)
        sha = _write_manifest(asset, new, was=pointer.sha256)
        write_pointer(asset, sha, parent=pointer.sha256, kind="sharded", guard=guard)
        log.info("compacted %d shards of %s", len(rewritten), redact_url(asset_base(asset.url)))
        return RewriteResult(sha, ((pointer.sha256, sha),), tuple(rewritten), 0)


def _refuse_single_files(asset: Location, wanted: frozenset[str]) -> None:
    """A single-file version under ``v/`` holding a purged path cannot be rewritten here."""
    base = asset_base(asset.url)
    home = asset.with_url(base)
    name = posixpath.basename(base)
    folder = home.join("v")
    for path in folder.ask("its listing", "ls", folder.path, detail=False, listed=MAX_VERSIONS):
        key = posixpath.basename(path.rstrip("/"))
        file = home.join("v", key, f"{name}.h5")
        if len(key) != KEY_HEX or not file.ask("whether it exists", "exists", file.path):
            continue
        check_tree(home, "v", key, f"{name}.h5")
        with open_h5(file) as h5:
            held = wanted & set(texts(h5[fmt.PATHS][:]))
        if held:
            raise ValueError(
                f"version {key} of {redact_url(base)} is a single file holding "
                f"{sorted(held)[:3]}: it cannot be purged in place; delete that version's "
                "folder (or wait for retention), then purge again"
            )


def _republish(
    asset: Location,
    versions: list[tuple[str, VersionManifest]],
    new_shards: dict[str, tuple[ShardEntry, str] | None],
    row_maps: dict[str, dict[int, int]],
    removed: int,
    wanted: frozenset[str],
) -> RewriteResult:
    """Upload the rewritten shards, write every version's manifest anew (oldest parent
    first), move the pointer, then delete what no version lists."""
    guard = guard_pointer(asset)
    pointer = guard.pointer
    if not new_shards:
        return RewriteResult(pointer.sha256 if pointer else "", (), (), 0)
    for made in new_shards.values():
        if made is not None:
            _upload(asset, made[0].sha256, made[1])
    renamed: dict[str, str] = {}
    order = _parents_first(versions)
    keep_shards: set[str] = set()
    for sha, manifest in order:
        entries = []
        for entry in manifest.shards:
            if entry.sha256 not in new_shards:
                entries.append(entry)
                continue
            made = new_shards[entry.sha256]
            if made is None:
                continue
            mapping = row_maps[entry.sha256]
            deleted = tuple(sorted(mapping[r] for r in entry.deleted if r in mapping))
            live = [r for r in entry.live_rows().tolist() if r in mapping]
            splits = _splits(made[1], mapping, live)
            entries.append(replace(made[0], deleted=deleted, labels=entry.labels, splits=splits))
        keep_shards.update(e.sha256 for e in entries)
        parent = renamed.get(manifest.parent, manifest.parent)
        new = replace(manifest, shards=tuple(entries), parent=parent)
        # A purged path leaves the sources map too (the next build sees it as new, if it
        # is still in the source); the old version's preview is not carried over (it may
        # show a purged sample).
        renamed[sha] = _write_manifest(asset, new, was=sha, drop=wanted)
    latest = ""
    if pointer is not None:
        latest = renamed.get(pointer.sha256, pointer.sha256)
        parent = renamed.get(pointer.parent, pointer.parent)
        if latest != pointer.sha256:
            write_pointer(asset, latest, parent=parent, kind=pointer.kind, guard=guard)
    gone = [s for s, n in renamed.items() if n != s]
    _remove_unlisted(asset, new_shards.keys(), gone, keep_shards)
    log.info("purged %d rows from %s", removed, redact_url(asset_base(asset.url)))
    return RewriteResult(
        latest,
        tuple((s, n) for s, n in renamed.items() if n != s),
        tuple((s, m[0].sha256 if m else "") for s, m in new_shards.items()),
        removed,
    )


def _splits(local: str, mapping: dict[int, int], live: list[int]) -> dict[str, int]:
    """Live rows per split of the rewritten shard at ``local``, for the rows ``live`` (old
    numbering) that ``mapping`` carries over."""
    with open_h5(Location(local)) as h5:
        names = texts(h5[fmt.SPLIT_NAMES][:])
        splits = h5[fmt.SPLITS][:]
    counts: dict[str, int] = {}
    for r in live:
        name = names[int(splits[mapping[r]])]
        if name:
            counts[name] = counts.get(name, 0) + 1
    return counts


def _parents_first(
    versions: list[tuple[str, VersionManifest]],
) -> list[tuple[str, VersionManifest]]:
    """The versions ordered so that each comes after its parent (when that is listed)."""
    by_sha = dict(versions)
    done: dict[str, VersionManifest] = {}

    def visit(sha: str, seen: frozenset[str]) -> None:
        if sha in done or sha in seen:
            return
        parent = by_sha[sha].parent
        if parent in by_sha:
            visit(parent, seen | {sha})
        done[sha] = by_sha[sha]

    for sha, _ in versions:
        visit(sha, frozenset())
    return list(done.items())

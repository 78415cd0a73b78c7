"""The pack stage of a sharded version: new shards for what the latest version lacks.

:func:`h5forge.flows.build.build_dataset` packs a sharded version (``max_shard_size``) with
:func:`pack_here` on this machine's worker pool (the shards are uploaded by the publish stage),
or, with ``executor="dask"``, with :func:`pack_on_workers`: the Dask workers pack the shards
and upload them to the store themselves (:func:`h5forge.flows.dask_stage.pack_shards_on_dask`),
and nothing merges them. Either way the verify, smoke-load and preview stages then check one
shard of the version as a local file (every new shard was verified in full when it was
sealed).
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from pathlib import Path

from h5forge.discover.catalog import Catalog
from h5forge.flows.config import BuildConfig
from h5forge.location import Location
from h5forge.pack.reuse import unchanged_paths
from h5forge.pack.writer import PackResult
from h5forge.publish.lineage import Basis
from h5forge.publish.shard_release import remove_staged
from h5forge.publish.sharded import Previous, StagedVersion, read_previous
from h5forge.publish.versions import asset_base, read_pointer
from h5forge.tasks.pack import pack_shards
from h5forge.tasks.parts import PartStats

__all__ = ["ShardedPacked", "pack_here", "pack_on_workers"]


@dataclass(frozen=True)
class ShardedPacked:
    """A sharded pack's outcome: the staged version, and one of its shards as the local file
    the verify, smoke-load and preview stages check."""

    packed: PackResult
    staged: StagedVersion
    stats: PartStats | None = None

    def remove_parts(self) -> None:
        """Delete the local shards (published)."""
        remove_staged(self.staged)


def _previous(dest: Location, basis: Basis) -> tuple[Previous | None, frozenset[str]]:
    """The sharded version a sharded build starts from (None when there is none, or when the
    pointer moved since the fingerprint: the publish will refuse), and the relative paths
    whose source files are unchanged since it."""
    previous = read_previous(dest, read_pointer(dest))
    if previous is not None and previous.sha256 != basis.latest_sha256:
        previous = None
    files = dict(basis.fingerprint.files) if basis.fingerprint is not None else {}
    unchanged = (
        frozenset(unchanged_paths(previous.sources or {}, files)) if previous else frozenset()
    )
    return previous, unchanged


def pack_here(
    config: BuildConfig,
    *,
    catalog: Catalog,
    work: Path,
    dest: Location,
    basis: Basis,
    dataset: str,
) -> ShardedPacked:
    """New shards for the samples the latest version does not hold unchanged, packed into
    ``work`` on this machine's worker pool (uploaded by the publish)."""
    assert config.max_shard_size is not None
    t0 = time.perf_counter()
    previous, unchanged = _previous(dest, basis)
    staged = pack_shards(
        catalog,
        work=str(work),
        dataset=dataset,
        name=posixpath.basename(asset_base(config.destination)),
        config=config.pack_config(),
        max_shard_size=config.max_shard_size,
        workers=config.workers,
        max_bad_fraction=config.max_bad_fraction,
        previous=previous,
        unchanged=unchanged,
    )
    local = staged.first_new or _fetch_shard(staged, dest, work)
    return _packed(staged, local, t0)


def pack_on_workers(
    config: BuildConfig,
    *,
    catalog: Catalog,
    work: Path,
    dest: Location,
    basis: Basis,
    dataset: str,
) -> ShardedPacked:
    """New shards packed and uploaded by the Dask workers; this machine plans, collects their
    manifest entries and downloads one new shard into ``work`` for the checks. No merge."""
    from h5forge.flows.dask_stage import pack_shards_on_dask

    t0 = time.perf_counter()
    previous, unchanged = _previous(dest, basis)
    staged, stats = pack_shards_on_dask(
        config,
        catalog=catalog,
        asset=dest,
        dataset=dataset,
        name=posixpath.basename(asset_base(config.destination)),
        previous=previous,
        unchanged=unchanged,
    )
    return _packed(staged, _fetch_shard(staged, dest, work), t0, stats)


def _packed(
    staged: StagedVersion, local: str, t0: float, stats: PartStats | None = None
) -> ShardedPacked:
    """``staged`` with ``local``, the shard the next stages check, as a :class:`PackResult`."""
    manifest = staged.manifest
    new = set(staged.new) | staged.in_store
    packed = PackResult(
        path=local,
        num_samples=manifest.num_samples,
        num_quarantined=len(staged.quarantined),
        num_classes=len(manifest.classes),
        classes=manifest.classes,
        quarantined=staged.quarantined,
        bytes=sum(e.bytes for e in manifest.shards),
        seconds=time.perf_counter() - t0,
        counts=staged.counts,
        reused=manifest.num_samples - sum(e.live for e in manifest.shards if e.sha256 in new),
    )
    return ShardedPacked(packed, staged, stats)


def _fetch_shard(staged: StagedVersion, dest: Location, work: Path) -> str:
    """A local copy of one shard of the version already in the store (the first new one, or
    the first), for the checks that follow the pack: the store's own file when it is local."""
    entry = next(
        (e for e in staged.manifest.shards if e.sha256 in staged.in_store),
        staged.manifest.shards[0],
    )
    base = asset_base(dest.url)
    shard = dest.with_url(staged.manifest.shard_url(base, entry))
    if shard.is_local:
        return shard.path
    local = str(work / "shard-check.h5")
    shard.fs.get_file(shard.path, local)
    return local

"""Part-parallel packing on a real Dask cluster, byte-copy merge, resume after a crash."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
import h5py
import numpy as np
import pytest
from distributed import Client, LocalCluster

from h5forge.demo import write_bad_files, write_image_folder
from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import EmptyDatasetError, TooManyBadImagesError, UnsealedFileError
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.read.dataset import H5ImageDataset
from h5forge.scale.merge import merge_parts
from h5forge.scale.parts import PartResult, find_done_parts, pack_part, remove_parts
from h5forge.scale.plan import PartSpec, part_catalog, part_location, part_url, plan_parts
from h5forge.verify.checks import verify

DECODED = ImageConfig(resize="resize", size=(24, 32))
ENCODED = ImageConfig(layout="encoded", encoding="original", resize="none", size=None)
BUILDS: dict[str, dict[str, Any]] = {
    "decoded": {"config": PackConfig(DECODED)},
    "decoded-gzip": {"config": PackConfig(DECODED, compression="gzip", compression_level=6)},
    "encoded": {"config": PackConfig(ENCODED)},
}
PER_PART = 7


@dataclass(frozen=True)
class Source:
    catalog: Catalog
    refs: dict[str, PackResult]  # build name -> plain local pack of the same catalog


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    """train/val x 3 classes of JPEG/PNG files plus broken files (quarantined), packed locally."""
    root = tmp_path_factory.mktemp("part_src")
    write_image_folder(
        root,
        classes=("ant", "bee", "cow"),
        per_class=8,
        splits=("train", "val"),
        seed=3,
        size=((20, 60), (20, 60)),
        formats=("jpeg", "png"),
    )
    write_bad_files(root / "train" / "bee")
    catalog = discover(root)
    out = tmp_path_factory.mktemp("part_ref")
    refs = {
        name: pack(catalog, out / f"{name}.h5", workers=1, max_bad_fraction=0.2, **kw)
        for name, kw in BUILDS.items()
    }
    assert refs["decoded"].num_quarantined > 0
    return Source(catalog, refs)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    """A real two-process Dask cluster; test-module functions travel to it by value."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with (
        # ":0": a free port (None means distributed's default 8787, which another cluster
        # on the machine may hold: a warning, an error under -W error).
        LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _urls(staging: Path, specs: list[PartSpec]) -> list[str]:
    return [part_url(str(staging), s) for s in specs]


def _assert_same_asset(got: str, ref: PackResult) -> None:
    """Same samples, labels, splits, digests, quarantine, and the same stored bytes."""
    verify(got)
    with h5py.File(got) as a, h5py.File(ref.path) as b:
        for name in (
            "digests",
            "labels",
            "splits",
            "paths",
            "classes",
            "split_names",
            "quarantine/paths",
            "quarantine/reasons",
        ):
            assert np.array_equal(a[name][()], b[name][()]), name
        for name in (
            "layout",
            "storage",
            "encoding",
            "mode",
            "config_json",
            "compression",
            "num_samples",
            "num_classes",
            "num_quarantined",
        ):
            assert a.attrs[name] == b.attrs[name], name
        if b.attrs["storage"] == "blob":
            for name in ("images", "offsets", "shapes"):
                assert np.array_equal(a[name][()], b[name][()]), name
        else:
            for i in range(b["images"].shape[0]):  # the stored chunk, filter mask included
                assert a["images"].id.read_direct_chunk((i, 0, 0, 0)) == b[
                    "images"
                ].id.read_direct_chunk((i, 0, 0, 0)), i
    got_ds, ref_ds = H5ImageDataset(got), H5ImageDataset(ref.path)
    for i in range(len(ref_ds)):
        (x, y), (x_ref, y_ref) = got_ds[i], ref_ds[i]
        assert y == y_ref
        assert np.array_equal(x.numpy(), x_ref.numpy()), i


def _build(
    client: Client, catalog: Catalog, specs: list[PartSpec], staging: Path, **kw: Any
) -> list[PartResult]:
    """The resumable build: pack on the cluster only the parts that are not done yet."""
    done = find_done_parts(str(staging), specs, **kw)
    todo = [s for s in specs if s.index not in done]
    futures = client.map(
        pack_part,
        [part_catalog(catalog, s) for s in todo],
        todo,
        staging=str(staging),
        pure=False,
        **kw,
    )
    results: list[PartResult] = client.gather(futures)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("build", sorted(BUILDS))
def test_dask_build_equals_local_pack(
    build: str, source: Source, client: Client, tmp_path: Path
) -> None:
    kw = BUILDS[build]
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)
    assert len(specs) >= 6
    # hash=False: a fresh key per test. Scattered by content, every build case would reuse one
    # key, and the scheduler's release of the previous case's copy could race this broadcast
    # ("lost dependencies", seen in 2 of 5 full runs).
    whole = client.scatter(source.catalog, broadcast=True, hash=False)  # or one slice per task
    futures = client.map(
        pack_part,
        [whole] * len(specs),
        specs,
        staging=str(tmp_path / "staging"),
        pure=False,
        **kw,
    )
    results: list[PartResult] = client.gather(futures)
    assert [r.index for r in results] == [s.index for s in specs]
    assert sum(r.num_quarantined for r in results) == source.refs[build].num_quarantined
    merged = merge_parts([r.url for r in results], tmp_path / "merged.h5", max_bad_fraction=0.2)
    ref = source.refs[build]
    assert (merged.num_samples, merged.quarantined, merged.counts) == (
        ref.num_samples,
        ref.quarantined,
        ref.counts,
    )
    _assert_same_asset(merged.path, ref)


def _pack_or_die(
    marker: str, catalog: Catalog, spec: PartSpec, staging: str, **kw: Any
) -> PartResult:
    """Kill the worker process that runs it, the first time only (the marker remembers)."""
    if spec.index == 2 and not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return pack_part(catalog, spec, staging, **kw)


@pytest.mark.slow
def test_killed_worker_is_rescheduled(source: Source, client: Client, tmp_path: Path) -> None:
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)
    before = set(client.run(os.getpid).values())
    marker = str(tmp_path / "killed")
    futures = client.map(
        _pack_or_die,
        [marker] * len(specs),
        [part_catalog(source.catalog, s) for s in specs],
        specs,
        staging=str(tmp_path / "staging"),
        pure=False,
        **BUILDS["decoded"],
    )
    results = client.gather(futures)
    killed = int(Path(marker).read_text())
    assert killed in before
    client.wait_for_workers(2, timeout=30)
    after = set(client.run(os.getpid).values())
    assert killed not in after
    assert len(after - before) == 1  # the nanny started a new worker process
    assert find_done_parts(str(tmp_path / "staging"), specs, **BUILDS["decoded"]) == {
        s.index for s in specs
    }
    merged = merge_parts([r.url for r in results], tmp_path / "m.h5", max_bad_fraction=0.2)
    _assert_same_asset(merged.path, source.refs["decoded"])


@pytest.mark.slow
def test_resume_redoes_only_the_missing_parts(
    source: Source, client: Client, tmp_path: Path
) -> None:
    kw = BUILDS["decoded-gzip"]
    staging = tmp_path / "staging"
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)
    n, k = len(specs), 3
    first = _build(client, source.catalog, specs[:k], staging, **kw)  # "crashed" after k
    assert sorted(r.index for r in first) == list(range(k))
    # Killed between the upload and its sidecar: a file with no commit marker is not done.
    torn = specs[k]
    shutil.copyfile(first[0].url, staging / torn.name)
    stamps = {p.name: p.stat().st_mtime_ns for p in staging.iterdir()}

    rerun = _build(client, source.catalog, specs, staging, **kw)
    assert sorted(r.index for r in rerun) == list(range(k, n))  # only n - k packed again
    for s in specs[:k]:
        for name in (s.name, s.name + ".manifest.json"):
            assert (staging / name).stat().st_mtime_ns == stamps[name], name
    assert _build(client, source.catalog, specs, staging, **kw) == []  # all done: nothing to do
    merged = merge_parts(_urls(staging, specs), tmp_path / "m.h5", max_bad_fraction=0.2)
    _assert_same_asset(merged.path, source.refs["decoded-gzip"])


def _flip_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x01]))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 100)


def _stale_sidecar(path: Path) -> None:
    m = Path(str(path) + ".manifest.json")
    data = json.loads(m.read_text())
    m.write_text(json.dumps({**data, "fingerprint": "0" * 64}))


@pytest.mark.parametrize("damage", [_flip_byte, _truncate, _stale_sidecar, os.unlink])
def test_damaged_part_is_not_done_and_is_redone(
    damage: Any, source: Source, tmp_path: Path
) -> None:
    kw = BUILDS["decoded"]
    staging = tmp_path / "staging"
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)[:3]
    for s in specs:
        pack_part(source.catalog, s, str(staging), **kw)
    assert find_done_parts(str(staging), specs, **kw) == {0, 1, 2}
    damage(staging / specs[1].name)
    assert find_done_parts(str(staging), specs, **kw) == {0, 2}
    pack_part(source.catalog, specs[1], str(staging), **kw)
    assert find_done_parts(str(staging), specs, **kw) == {0, 1, 2}
    verify(part_url(str(staging), specs[1]))


def test_other_options_or_catalog_are_not_done(
    source: Source, tmp_path: Path, image_folder: Path
) -> None:
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)[:2]
    for s in specs:
        pack_part(source.catalog, s, str(tmp_path), config=PackConfig(DECODED))
    assert find_done_parts(str(tmp_path), specs, config=PackConfig(DECODED)) == {0, 1}
    lzf = PackConfig(DECODED, compression="lzf")
    assert find_done_parts(str(tmp_path), specs, config=lzf) == set()
    other = plan_parts(discover(image_folder), samples_per_part=PER_PART)[:2]
    assert find_done_parts(str(tmp_path), other, config=PackConfig(DECODED)) == set()
    with pytest.raises(ValueError, match="another catalog"):
        pack_part(source.catalog, other[1], str(tmp_path), config=PackConfig(DECODED))


def test_a_staging_folder_of_an_older_h5forge_is_refused_naming_the_fix(
    source: Source, tmp_path: Path
) -> None:
    """Parts were called shards (``shard-NNNNN.h5``): such a folder is refused, not resumed
    beside new ``part-NNNNN.h5`` files, and nothing in it is read or touched."""
    kw = BUILDS["decoded"]
    staging = tmp_path / "staging"
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)[:2]
    pack_part(source.catalog, specs[0], str(staging), **kw)
    assert specs[0].name == "part-00000.h5"
    for suffix in ("", ".manifest.json"):  # as the older h5forge left them
        os.rename(staging / f"part-00000.h5{suffix}", staging / f"shard-00000.h5{suffix}")
    before = sorted(p.name for p in staging.iterdir())
    with pytest.raises(ValueError, match="older h5forge") as refused:
        find_done_parts(str(staging), specs, **kw)
    message = str(refused.value)
    assert str(staging / "shard-00000.h5") in message
    assert "part-NNNNN.h5" in message
    assert "delete those files" in message
    assert sorted(p.name for p in staging.iterdir()) == before
    os.unlink(staging / "shard-00000.h5")  # the sidecar alone is no part file
    assert find_done_parts(str(staging), specs, **kw) == set()


def test_a_staging_location_carries_its_options_to_every_step(
    source: Source, tmp_path: Path, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    """Parts in a bucket reached only through the Location's options (the endpoint is in
    them, nowhere else): packed, found done, merged, removed."""
    kw = BUILDS["encoded"]
    staging = Location(f"s3://{s3_bucket}/staging", s3_storage_options)
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)
    results = [pack_part(source.catalog, s, staging, **kw) for s in specs]
    assert [r.url for r in results] == [str(part_location(staging, s)) for s in specs]
    assert find_done_parts(staging, specs, **kw) == {s.index for s in specs}
    merged = merge_parts(
        [part_location(staging, s) for s in specs], tmp_path / "m.h5", max_bad_fraction=0.2
    )
    _assert_same_asset(merged.path, source.refs["encoded"])
    assert remove_parts(staging, specs) == 2 * len(specs)  # each file and its sidecar
    staging.fs.invalidate_cache()
    assert staging.fs.find(staging.path) == []


def test_merge_from_a_remote_staging_url(source: Source, tmp_path: Path) -> None:
    """Parts in a bucket-like store (memory://) are downloaded one at a time and merged."""
    kw = BUILDS["encoded"]
    staging = "memory://h5forge-test-staging"
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)
    try:
        results = [pack_part(source.catalog, s, staging, **kw) for s in specs]
        assert find_done_parts(staging, specs, **kw) == {s.index for s in specs}
        merged = merge_parts(
            [r.url for r in results],
            tmp_path / "m.h5",
            max_bad_fraction=0.2,
            source_url="https://example.org/x.tar",
            source_sha256="ab" * 32,
        )
    finally:
        import fsspec

        fsspec.filesystem("memory").rm("/h5forge-test-staging", recursive=True)
    _assert_same_asset(merged.path, source.refs["encoded"])
    with h5py.File(merged.path) as h5:
        assert h5.attrs["source_url"] == "https://example.org/x.tar"


@pytest.fixture(scope="module")
def local_parts(source: Source, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each build's parts, packed in this process, for the merge checks below."""
    out: dict[str, list[str]] = {}
    specs = plan_parts(source.catalog, samples_per_part=PER_PART)
    for name, kw in BUILDS.items():
        staging = tmp_path_factory.mktemp(f"parts_{name}")
        out[name] = [pack_part(source.catalog, s, str(staging), **kw).url for s in specs]
    return out


def test_merge_applies_the_quarantine_limit_to_the_total(
    local_parts: dict[str, list[str]], source: Source, tmp_path: Path
) -> None:
    bad = source.refs["decoded"].num_quarantined
    total = bad + source.refs["decoded"].num_samples
    with pytest.raises(TooManyBadImagesError, match=f"{bad} of {total} inputs"):
        merge_parts(local_parts["decoded"], tmp_path / "m.h5", max_bad_fraction=0.01)
    assert not (tmp_path / "m.h5").exists()
    assert not (tmp_path / "m.h5.partial").exists()


def test_merge_refuses_a_mix_and_bad_inputs(
    local_parts: dict[str, list[str]], tmp_path: Path
) -> None:
    mixed = local_parts["decoded"][:2] + local_parts["decoded-gzip"][2:]
    with pytest.raises(ValueError, match="parts disagree on root attribute compression"):
        merge_parts(mixed, tmp_path / "m.h5", max_bad_fraction=1.0)
    with pytest.raises(ValueError, match="no parts"):
        merge_parts([], tmp_path / "m.h5")
    with pytest.raises(UnsealedFileError, match="partial"):
        merge_parts([local_parts["decoded"][0] + ".partial"], tmp_path / "m.h5")
    # Parts of one class only: the merged file would lack the other classes.
    with pytest.raises(EmptyDatasetError, match="has no readable image"):
        merge_parts(local_parts["decoded"][:1], tmp_path / "m.h5", max_bad_fraction=1.0)
    (tmp_path / "taken.h5").write_bytes(b"")
    with pytest.raises(FileExistsError):
        merge_parts(local_parts["decoded"], tmp_path / "taken.h5", max_bad_fraction=1.0)


def test_plan_covers_every_sample_once(source: Source) -> None:
    n = len(source.catalog.samples)
    by_count = plan_parts(source.catalog, samples_per_part=PER_PART)
    assert [s.count for s in by_count[:-1]] == [PER_PART] * (len(by_count) - 1)
    sizes = [os.stat(s.path).st_size for s in source.catalog.samples]
    limit = sum(sizes) // 5
    by_bytes = plan_parts(source.catalog, bytes_per_part=limit)
    both = plan_parts(source.catalog, samples_per_part=4, bytes_per_part=limit)
    for plan in (by_count, by_bytes, both):
        assert plan[0].start == 0
        assert plan[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(plan, plan[1:], strict=False))
        assert [s.index for s in plan] == list(range(len(plan)))
    assert 4 <= len(by_bytes) <= 6
    assert all(s.source_bytes >= limit for s in by_bytes[:-1])
    assert sum(s.source_bytes for s in by_bytes) == sum(sizes)
    assert max(s.count for s in both) <= 4


@pytest.mark.parametrize(
    "kwargs", [{}, {"samples_per_part": 0}, {"bytes_per_part": -1}, {"samples_per_part": 2.5}]
)
def test_plan_refuses_bad_limits(source: Source, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="samples_per_part|bytes_per_part"):
        plan_parts(source.catalog, **kwargs)


def test_a_part_of_only_bad_inputs_merges(source: Source, tmp_path: Path) -> None:
    """One input per part: the parts of broken files hold no sample, only their quarantine."""
    cat = source.catalog
    quarantined = {p for p, _ in source.refs["encoded"].quarantined}
    by_class = {s.label: s for s in cat.samples if s.relpath not in quarantined}
    bad = [s for s in cat.samples if s.relpath in quarantined][:2]
    small = Catalog(
        root=cat.root,
        samples=(*by_class.values(), *bad),
        classes=cat.classes,
        splits=cat.splits,
        skipped={},
    )
    specs = plan_parts(small, samples_per_part=1)
    results = [pack_part(small, s, str(tmp_path / "staging"), **BUILDS["encoded"]) for s in specs]
    assert [r.num_samples for r in results] == [1, 1, 1, 0, 0]
    merged = merge_parts([r.url for r in results], tmp_path / "m.h5", max_bad_fraction=0.5)
    ref = pack(small, tmp_path / "ref.h5", workers=1, max_bad_fraction=0.5, **BUILDS["encoded"])
    assert merged.quarantined == ref.quarantined
    assert len(merged.quarantined) == 2
    _assert_same_asset(merged.path, ref)


@pytest.mark.slow
def test_a_pool_inside_a_daemonic_dask_worker_is_refused(
    source: Source, client: Client, tmp_path: Path
) -> None:
    spec = plan_parts(source.catalog, samples_per_part=PER_PART)[0]
    future = client.submit(
        pack_part,
        part_catalog(source.catalog, spec),
        spec,
        str(tmp_path),
        config=PackConfig(DECODED),
        processes=2,
        pure=False,
    )
    with pytest.raises(ValueError, match="daemonic process"):
        future.result()

"""The reader's ``target=``: resolving it against a schema, the values it hands out, their
batches, damaged values, DataLoader workers and remote reads (h5forge.read.targets,
h5forge.read.targets)."""

from __future__ import annotations

import io
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from h5forge.asset.ranges import RangeReader
from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.targets import TargetReads, select
from h5forge.targets.geometry import Geometry
from h5forge.targets.schema import Column
from h5forge.targets.store import TargetSink, encode_targets
from tests.fixtures.targets_data import write_coco_dataset
from tests.vision.scenes import TAGS as SCENE_TAGS
from tests.vision.scenes import write_scenes

TAGS = Column("tags", "multilabel", classes=("a", "b", "c"))
BOXES = Column("objects", "boxes", classes=("cat", "dog"))
CAPTION = Column("caption", "text")
SCORE = Column("score", "number", dtype="float64")
COUNT = Column("count", "number", dtype="int64")


def _mask_column(encoding: str = "raw") -> Column:
    return Column("seg", "mask", encoding=encoding)


SCHEMA = (TAGS, BOXES, _mask_column(), CAPTION, SCORE)
H, W = 30, 40
RNG = np.random.default_rng(0)
MASKS = [RNG.integers(0, 4, (H, W), dtype=np.uint8) for _ in range(3)]
RAWS = [
    {
        "tags": (0, 2),
        "objects": ((1, 2, 30, 20, 1, 0),),
        "seg": "m0",
        "caption": "één",
        "score": 0.5,
    },
    {"tags": (), "objects": (), "seg": "m1", "caption": "", "score": -2.0},
    {
        "tags": (1,),
        "objects": ((0, 0, 40, 30, 0, 1), (5, 5, 6, 6, 1, 0)),
        "seg": "m2",
        "caption": "x" * 1000,
        "score": 3.25,
    },
]


def _png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _write(path: Path, schema: tuple[Column, ...] = SCHEMA) -> Path:
    files = {f"m{i}": _png(m) for i, m in enumerate(MASKS)}
    sink = TargetSink(schema)
    for raw in RAWS:
        values = {c.name: raw[c.name] for c in schema}
        sink.add(
            encode_targets(
                schema, values, Geometry((W, H)), read=files.__getitem__, max_pixels=H * W
            )
        )
    with h5py.File(path, "w") as h5:
        sink.write(h5)
    return path


def _reads(path: Path, schema=SCHEMA, *, digests: bool = False) -> TargetReads:
    with h5py.File(path, "r") as h5:
        return TargetReads(
            h5,
            schema,
            image_hw=np.broadcast_to(np.asarray((H, W), np.int64), (len(RAWS), 2)),
            want_digests=digests,
            where=str(path),
        )


def _read_values(path: Path, reads: TargetReads, rows: list[int]) -> list[dict]:
    (ranges, bufs), every = reads.wanted(rows)
    reader = RangeReader(Location(str(path)))
    try:
        reader.read_into(ranges, bufs)
    finally:
        reader.close()
    return reads.values(rows, every)


# --------------------------------------------------------------------------- select


@pytest.mark.parametrize(
    ("target", "keys", "as_dict"),
    [
        ("class", ("class",), False),
        ("boxes", ("objects",), False),  # a kind word: the one column of that kind
        ("objects", ("objects",), False),  # a column name
        ("mask", ("seg",), False),
        (["class", "mask", "caption"], ("class", "seg", "caption"), True),
        (("number",), ("score",), True),
    ],
)
def test_target_words_names_and_lists_resolve(target, keys, as_dict):
    sel = select(target, SCHEMA, where="f.h5")
    assert sel.keys == keys
    assert sel.as_dict is as_dict
    assert [c.name for c in sel.columns] == [k for k in keys if k != "class"]


@pytest.mark.parametrize(
    ("target", "schema", "message"),
    [
        ("boxs", SCHEMA, r"'boxs' is no column name or kind there; its columns are 'tags' "),
        ("number", (SCORE, COUNT), "it has 2 number columns, name one; its columns are"),
        ("text", (TAGS,), r"is no column name or kind there; its columns are 'tags' \(multilabel"),
        ("boxes", (), "this asset has no target columns .* Pack it from a source with target"),
        (["mask", "seg"], SCHEMA, "asks for a column twice"),
        ([], SCHEMA, "non-empty list"),
        (3, SCHEMA, "must be 'class', a column name"),
    ],
)
def test_bad_targets_name_the_columns(target, schema, message):
    with pytest.raises(ValueError, match=message):
        select(target, schema, where="f.h5")


def test_a_name_wins_over_a_kind_word():
    named_like_a_kind = Column("mask", "text")
    sel = select("mask", (named_like_a_kind, _mask_column()), where="f.h5")
    assert sel.columns == (named_like_a_kind,)


def test_multilabel_form_and_iscrowd_are_checked():
    with pytest.raises(ValueError, match="multilabel='onehot' must be one of"):
        select("tags", SCHEMA, where="f.h5", multilabel="onehot")
    with pytest.raises(ValueError, match="iscrowd='yes' must be True or False"):
        select("boxes", SCHEMA, where="f.h5", iscrowd="yes")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- reads and values


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_values_read_by_range_equal_the_source(tmp_path, encoding):
    schema = (TAGS, BOXES, _mask_column(encoding), CAPTION, SCORE)
    path = _write(tmp_path / "t.h5", schema)
    reads = _reads(path, schema, digests=True)
    rows = [2, 0, 1]
    got = _read_values(path, reads, rows)
    for r, values in zip(rows, got, strict=True):
        raw = RAWS[r]
        assert values["tags"].tolist() == list(raw["tags"])
        assert values["objects"].tolist() == [list(map(float, b)) for b in raw["objects"]]
        assert np.array_equal(values["seg"], MASKS[r])
        assert values["caption"] == raw["caption"]
        assert values["score"] == raw["score"]


def test_targets_as_torch_values(tmp_path):
    path = _write(tmp_path / "t.h5")
    reads = _reads(path)
    values = _read_values(path, reads, [0, 2])
    asked = ["class", "tags", "boxes", "mask", "text", "number"]
    sel = select(asked, SCHEMA, where="f", iscrowd=True)
    t0, t2 = (sel.target(7, v, (H, W)) for v in values)
    plain = select(asked, SCHEMA, where="f").target(7, values[1], (H, W))["objects"]
    assert sorted(plain) == ["boxes", "labels"]  # iscrowd only on request
    assert t0["class"] == 7
    assert t0["tags"].dtype == torch.float32
    assert t0["tags"].tolist() == [1.0, 0.0, 1.0]
    boxes = t2["objects"]
    assert boxes["boxes"].shape == (2, 4)
    assert boxes["boxes"].dtype == torch.float32
    assert boxes["boxes"][0].tolist() == [0, 0, 40, 30]
    assert boxes["labels"].tolist() == [0, 1]
    assert boxes["labels"].dtype == torch.int64
    assert boxes["iscrowd"].tolist() == [1, 0]
    assert boxes["iscrowd"].dtype == torch.uint8
    assert t2["seg"].dtype == torch.uint8
    assert torch.equal(t2["seg"].as_subclass(torch.Tensor), torch.from_numpy(MASKS[2]))
    assert t2["caption"] == RAWS[2]["caption"]
    assert t2["score"] == RAWS[2]["score"]
    indices = select("tags", SCHEMA, where="f", multilabel="indices").target(7, values[0], (H, W))
    assert indices.tolist() == [0, 2]


def test_batches_stack_fixed_values_and_list_variable_ones(tmp_path):
    path = _write(tmp_path / "t.h5")
    values = _read_values(path, _reads(path), [0, 1, 2])
    sel = select(["class", "tags", "boxes", "mask", "text", "number"], SCHEMA, where="f")
    batch = sel.collate([sel.target(k, v, (H, W)) for k, v in enumerate(values)])
    assert batch["class"].tolist() == [0, 1, 2]
    assert batch["tags"].shape == (3, 3)
    assert batch["score"].tolist() == [r["score"] for r in RAWS]
    assert batch["seg"].shape == (3, H, W)
    assert [len(b["boxes"]) for b in batch["objects"]] == [len(r["objects"]) for r in RAWS]
    assert batch["caption"] == [r["caption"] for r in RAWS]
    as_indices = select("tags", SCHEMA, where="f", multilabel="indices")
    lists = as_indices.collate([as_indices.target(0, v, (H, W)) for v in values])
    assert [t.tolist() for t in lists] == [list(r["tags"]) for r in RAWS]
    # masks of differing sizes (after a crop, say) stay a list
    masks = select("mask", SCHEMA, where="f")
    mixed = masks.collate(
        [torch.zeros(4, 5, dtype=torch.uint8), torch.zeros(5, 4, dtype=torch.uint8)]
    )
    assert [tuple(m.shape) for m in mixed] == [(4, 5), (5, 4)]


# --------------------------------------------------------------------------- damaged values
# (a damaged layout is refused at open: asset.target_layout, test_hostile_targets.py)


@pytest.mark.parametrize(
    ("column", "row_bytes", "message"),
    [
        ("caption", b"\xff\xfe", "does not decode"),
        ("tags", np.asarray([5, 0], np.int32).tobytes(), "class index 5, outside 0..2"),
        ("objects", np.asarray([[9, 0, 1, 1, 0, 0]], np.float32).tobytes(), "not a valid box"),
    ],
)
def test_a_damaged_value_is_an_integrity_error(tmp_path, column, row_bytes, message):
    path = _write(tmp_path / "t.h5")
    start, count = _reads(path).ranges[column][0]
    assert count == len(row_bytes) or column == "caption"
    blob = bytearray(path.read_bytes())
    blob[start : start + len(row_bytes)] = row_bytes
    path.write_bytes(bytes(blob))
    with pytest.raises(IntegrityError, match=message):
        _read_values(path, _reads(path), [0])


def test_verify_reads_checks_each_column_digest(tmp_path):
    path = _write(tmp_path / "t.h5")
    start, _ = _reads(path).ranges["caption"][2]
    blob = bytearray(path.read_bytes())
    blob[start] ^= 1  # still valid UTF-8 ("x" -> "y"): only the digest can tell
    path.write_bytes(bytes(blob))
    assert _read_values(path, _reads(path), [2])[0]["caption"].startswith("y")
    with pytest.raises(IntegrityError, match=r"/targets/caption\[2\] read back with sha256"):
        _read_values(path, _reads(path, digests=True), [2])


# --------------------------------------------------------------------------- packed files

ALL = ["class", "tags", "boxes", "mask", "text", "number"]
SCENE_CONFIGS = {
    "decoded": PackConfig(ImageConfig(resize="resize", size=(48, 64))),  # one size: batch path
    "encoded": PackConfig(ImageConfig(layout="encoded", encoding="png", resize="none", size=None)),
    "gzip": PackConfig(ImageConfig(resize="resize", size=(48, 64)), compression="gzip"),
}


@pytest.fixture(scope="module", params=sorted(SCENE_CONFIGS))
def scenes(request, tmp_path_factory) -> tuple[Path, list[dict[str, object]]]:
    root = tmp_path_factory.mktemp(f"scenes-{request.param}")
    catalog, raws = write_scenes(root / "src", 6)
    out = root / "scenes.h5"
    pack(catalog, out, config=SCENE_CONFIGS[request.param], workers=1)
    return out, raws


def _check_target(target: dict, raw: dict, *, iscrowd: bool) -> None:
    """What the reader handed out is what the source said (the pack kept the geometry);
    boxes dicts hold ``iscrowd`` exactly when it was asked for."""
    assert target["class"] == 0
    hot = torch.zeros(len(SCENE_TAGS))
    hot[list(raw["tags"])] = 1
    assert torch.equal(target["tags"], hot)
    boxes = target["objects"]
    assert boxes["boxes"].tolist() == [list(map(float, b[:4])) for b in raw["objects"]]
    assert boxes["labels"].tolist() == [b[4] for b in raw["objects"]]
    keys = ["boxes", "iscrowd", "labels"] if iscrowd else ["boxes", "labels"]
    assert sorted(boxes) == keys
    if iscrowd:
        assert boxes["iscrowd"].tolist() == [b[5] for b in raw["objects"]]
    want_mask = torch.from_numpy(np.array(Image.open(raw["seg"])))
    assert torch.equal(torch.as_tensor(target["seg"]), want_mask)
    assert target["caption"] == raw["caption"]
    assert target["score"] == raw["score"]


def test_every_kind_round_trips_through_the_dataset(scenes):
    path, raws = scenes
    ds = H5ImageDataset(path, target=ALL, verify_reads=True, iscrowd=True)
    plain = H5ImageDataset(path, target=ALL)
    for i, raw in enumerate(raws):
        image, target = ds[i]
        assert tuple(image.shape) == (3, 48, 64)
        _check_target(target, raw, iscrowd=True)
        _check_target(plain[i][1], raw, iscrowd=False)
    assert H5ImageDataset(path)[2][1] == 0  # target="class": the label, as in version 1
    assert ds.read_batch([1, 4])[1]["caption"] == [raws[1]["caption"], raws[4]["caption"]]


def test_unknown_target_and_version_1_file_are_refused_in_the_constructor(scenes, packed_decoded):
    path, _ = scenes
    with pytest.raises(ValueError, match=r"target='bbox'.*its columns are 'tags' \(multilabel\)"):
        H5ImageDataset(path, target="bbox")
    with pytest.raises(ValueError, match="this asset has no target columns"):
        H5ImageDataset(packed_decoded.path, target="boxes")
    as_dict = H5ImageDataset(packed_decoded.path, target=["class"])
    assert as_dict[0][1] == {"class": H5ImageDataset(packed_decoded.path)[0][1]}


@pytest.mark.slow
@pytest.mark.parametrize(("method", "iscrowd"), [("fork", True), ("spawn", False)])
def test_loader_workers_batch_fixed_targets_and_list_variable_ones(scenes, method, iscrowd):
    path, raws = scenes
    ds = H5ImageDataset(path, target=ALL, iscrowd=iscrowd)
    loader = ds.loader(4, num_workers=2, multiprocessing_context=method)
    seen = 0
    for images, targets in loader:
        b = len(images)
        assert tuple(images.shape) == (b, 3, 48, 64)
        assert targets["class"].dtype == torch.int64
        assert tuple(targets["tags"].shape) == (b, len(SCENE_TAGS))
        assert tuple(targets["seg"].shape) == (b, 48, 64)
        assert targets["score"].dtype == torch.float64
        assert isinstance(targets["objects"], list)
        assert isinstance(targets["caption"], list)
        for k in range(b):
            one = {key: value[k] for key, value in targets.items()}
            one["class"], one["score"] = int(one["class"]), float(one["score"])
            _check_target(one, raws[seen], iscrowd=iscrowd)
            assert torch.equal(images[k], ds[seen][0])
            seen += 1
    assert seen == len(raws)


def test_remote_reads_cost_at_most_one_request_per_column(
    tmp_path, s3_bucket, s3_storage_options, s3_requests
):
    """Over S3 (moto, requests counted at the server): one sample, and a batch of all twelve,
    each cost at most 1 + 5 range requests (the image's, one per column at most: the rows of
    a column lie side by side, and neighbouring ranges coalesce; the small columns cost none,
    read whole at open, for at most one more request than an open for the class alone), and
    the requests cover every wanted byte range."""
    catalog, raws = write_scenes(tmp_path / "src", 12, size=(256, 192))  # 1.7 MB of pixels
    local = tmp_path / "big.h5"
    pack(catalog, local, config=PackConfig(ImageConfig(resize="resize", size=(192, 256))))
    url = f"s3://{s3_bucket}/big.h5"
    publish(str(local), url, storage_options=s3_storage_options)
    opens = []
    for target in ("class", ALL):
        s3_requests.clear()
        # Uncached: the remote path's requests (the default cache would read the file once).
        ds = H5ImageDataset(url, target=target, storage_options=s3_storage_options, cache_dir=False)
        opens.append(len(s3_requests()))
    assert opens[1] <= opens[0] + 1, opens  # the small columns, held from open: one read
    truth = H5ImageDataset(local, target=ALL)
    st = truth._open()
    assert st.targets is not None
    for rows in ([0], [len(raws) - 1], list(range(len(raws)))):
        s3_requests.clear()
        images, targets = ds.read_batch(rows)
        spans = []
        for r in s3_requests():
            assert r.method == "GET", r
            first, _, last = (r.range or "")[len("bytes=") :].partition("-")
            spans.append((int(first), int(last) + 1))
        assert 1 <= len(spans) <= len(ALL), spans  # image + 5 columns
        wanted = st.index.byte_ranges[rows].tolist()
        for c in st.targets.columns:  # the small ones were read whole at open
            if c.name not in st.targets.resident:
                wanted += [r for r in st.targets.ranges[c.name][rows].tolist() if r[1]]
        assert set(st.targets.resident) == {"tags", "objects", "caption", "score"}
        for a, n in wanted:
            assert any(lo <= a and a + n <= hi for lo, hi in spans), (a, n, spans)
        assert torch.equal(images, truth.read_batch(rows)[0])
        assert targets["caption"] == [raws[r]["caption"] for r in rows]
        assert torch.equal(targets["seg"], truth.read_batch(rows)[1]["seg"])


@pytest.mark.parametrize(("multilabel", "iscrowd"), [("multihot", False), ("indices", True)])
def test_a_batch_read_at_once_equals_its_samples(scenes, multilabel, iscrowd):
    path, _ = scenes
    ds = H5ImageDataset(path, target=ALL, multilabel=multilabel, iscrowd=iscrowd)
    rows = [4, 0, 5, 2]
    images, batch = ds.read_batch(rows)
    items = [ds[r] for r in rows]
    assert torch.equal(images, torch.stack([image for image, _ in items]))
    for k, (_, one) in enumerate(items):
        assert batch["class"][k] == one["class"]
        assert batch["score"][k] == one["score"]
        assert batch["caption"][k] == one["caption"]
        assert torch.equal(batch["seg"][k], torch.as_tensor(one["seg"]))
        assert torch.equal(batch["tags"][k], one["tags"])
        assert len(one["objects"]) == 2 + iscrowd
        assert batch["objects"][k].keys() == one["objects"].keys()
        for key in one["objects"]:
            got, want = batch["objects"][k][key], one["objects"][key]
            assert got.dtype == want.dtype
            assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))


def test_a_batch_gathers_each_sample_s_boxes_from_memory(tmp_path):
    """COCO boxes (crowd ones among them, images without any): a batch of rows out of order
    and repeated, gathered from the column held in memory, holds each row's own boxes,
    labels and crowd flags, as the sample read alone does."""
    coco = write_coco_dataset(tmp_path / "coco", images=8, boxes_per_image=3, unannotated=2)
    config = PackConfig(ImageConfig(resize="resize", size=(32, 32)))
    out = pack(coco.root, tmp_path / "coco.h5", coco="annotations/instances.json", config=config)
    ds = H5ImageDataset(out.path, target="boxes", iscrowd=True)
    reads = ds._open().targets
    assert reads is not None
    assert [c.kind for c in reads.columns] == ["boxes"]
    assert reads.columns[0].name in reads.resident  # the path under test: held in memory
    rows = [7, 0, 3, 3, 6, 1, 0]
    _, batch = ds.read_batch(rows)
    counts = [len(ds[r][1]["labels"]) for r in rows]
    assert 0 in counts  # the unannotated images
    assert max(counts) == 3
    assert any(bool(ds[r][1]["iscrowd"].any()) for r in rows)
    for got, r in zip(batch, rows, strict=True):
        want = ds[r][1]
        assert sorted(got) == ["boxes", "iscrowd", "labels"]
        for key in want:
            assert torch.equal(got[key], want[key]), (r, key)


def test_a_damaged_box_in_a_batch_names_its_sample(scenes, tmp_path):
    path, _ = scenes
    copy = tmp_path / "damaged.h5"
    copy.write_bytes(path.read_bytes())
    ds = H5ImageDataset(copy, target="boxes")
    start, _ = ds._open().targets.ranges["objects"][3]
    blob = bytearray(copy.read_bytes())
    blob[start : start + 4] = np.float32("nan").tobytes()
    copy.write_bytes(bytes(blob))
    ds = H5ImageDataset(copy, target="boxes")
    with pytest.raises(IntegrityError, match=r"/targets/objects\[3\] holds the box \[nan"):
        ds.read_batch([1, 3])
    with pytest.raises(IntegrityError, match=r"/targets/objects\[3\] holds the box \[nan"):
        ds[3]


def _flip_and_shout(image, target):
    """A joint transform: mirror the image, its mask and boxes; upper-case the caption."""
    w = image.shape[-1]
    boxes = dict(target["objects"])
    b = boxes["boxes"].clone()
    b[:, 0], b[:, 2] = w - boxes["boxes"][:, 2], w - boxes["boxes"][:, 0]
    boxes["boxes"] = b
    flipped = {
        "objects": boxes,
        "seg": target["seg"].flip(-1),
        "caption": target["caption"].upper(),
    }
    return image.flip(-1), flipped


def test_transforms_see_image_and_target_together(scenes):
    path, raws = scenes
    target = ["boxes", "mask", "text"]
    plain = H5ImageDataset(path, target=target)
    ds = H5ImageDataset(path, target=target, transforms=_flip_and_shout)
    images, batch = next(iter(ds.loader(3, num_workers=1, multiprocessing_context="fork")))
    for k in range(3):
        image, want = plain[k]
        assert torch.equal(images[k], image.flip(-1))
        assert torch.equal(batch["seg"][k], torch.as_tensor(want["seg"]).flip(-1))
        assert batch["caption"][k] == raws[k]["caption"].upper()
        x1, _, x2, _ = raws[k]["objects"][0][:4]
        assert batch["objects"][k]["boxes"][0, [0, 2]].tolist() == [64 - x2, 64 - x1]


@pytest.mark.slow
def test_index_lists_from_workers_are_lists_of_int64(scenes):
    path, raws = scenes
    ds = H5ImageDataset(path, target="tags", multilabel="indices")
    got = [
        t.tolist()
        for _, tags in ds.loader(4, num_workers=1, multiprocessing_context="fork")
        for t in tags
        if t.dtype == torch.int64
    ]
    assert got == [list(r["tags"]) for r in raws]

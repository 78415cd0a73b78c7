"""The peers of ``bench_remote``: Mosaic Streaming and LitData, each writing its own format with
its own writer from the pixels of an h5forge file, and reading it back as ``(C x H x W uint8,
label)`` items for a plain DataLoader.

Install with ``pip install -e '.[bench]'``. Mosaic's ``streaming`` package imports
``streaming.vision`` (torchvision) and ``streaming.base.dataloader`` (transformers) on import;
neither is on the path it is measured on (``StreamingDataset`` over MDS shards). Where
torchvision has no build for this torch (``+cpu`` wheels come from PyTorch's own index),
:func:`import_streaming` gives those two import lines empty stand-ins, and says so.
"""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

SHARD_BYTES = 1 << 26  # both peers' default shard (chunk) size, 64 MiB


def _pixels(h5_path: str) -> tuple[Any, np.ndarray]:
    """(per-sample H x W x C arrays, labels) of a decoded fixed-size h5forge file."""
    import h5py

    f = h5py.File(h5_path, "r")
    return f["images"], f["labels"][()]


# What ``streaming`` imports eagerly from torchvision and transformers, none of it used by
# ``StreamingDataset`` over MDS shards: module -> names.
_EAGER = {
    "torchvision": {},
    "torchvision.datasets": {"VisionDataset": torch.utils.data.Dataset, "CIFAR10": object},
    "torchvision.transforms": {},
    "torchvision.transforms.functional": {"to_tensor": None},
    "transformers": {},
    "transformers.feature_extraction_utils": {"BatchFeature": type("BatchFeature", (), {})},
    "transformers.tokenization_utils_base": {"BatchEncoding": type("BatchEncoding", (), {})},
    "transformers.models": {},
    "transformers.models.auto": {},
    "transformers.models.auto.tokenization_auto": {"AutoTokenizer": object},
}


def import_streaming() -> tuple[Any, str]:
    """``streaming`` (Mosaic) and a note naming the stand-ins its eager imports needed."""
    missing = []
    for top in ("torchvision", "transformers"):
        try:
            __import__(top)
        except (ImportError, RuntimeError):
            missing.append(top)
    for name, attrs in _EAGER.items():
        if name.split(".")[0] in missing:
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            sys.modules[name] = mod
    import streaming

    note = f"stand-ins for {', '.join(missing)} (imported by streaming, unused here)"
    return streaming, note if missing else ""


def write_mds(h5_path: str, out: Path) -> None:
    """Mosaic MDS shards of the file's pixels (``MDSWriter``, raw bytes + int label)."""
    streaming, _ = import_streaming()
    images, labels = _pixels(h5_path)
    columns = {"image": "bytes", "label": "int"}
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=SHARD_BYTES) as w:
        for i in range(len(labels)):
            w.write({"image": images[i].tobytes(), "label": int(labels[i])})


def mosaic_dataset(remote: str, local: Path, shape: tuple[int, ...], batch_size: int) -> Any:
    """Mosaic's ``StreamingDataset`` over ``remote`` (cache in ``local``), items as tensors."""
    streaming, _ = import_streaming()

    class Images(streaming.StreamingDataset):  # type: ignore[misc, name-defined]
        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            item = super().__getitem__(i)
            arr = np.frombuffer(item["image"], np.uint8).reshape(shape)
            return torch.from_numpy(arr).permute(2, 0, 1), int(item["label"])

    streaming.base.util.clean_stale_shared_memory()
    return Images(
        remote=remote, local=str(local), shuffle=True, shuffle_seed=1, batch_size=batch_size
    )


def write_litdata(h5_path: str, out: Path) -> None:
    """LitData chunks of the file's pixels (its ``BinaryWriter``, as ``optimize`` uses)."""
    from litdata.streaming.writer import BinaryWriter

    images, labels = _pixels(h5_path)
    w = BinaryWriter(str(out), chunk_bytes=SHARD_BYTES)
    for i in range(len(labels)):
        w[i] = {"image": np.ascontiguousarray(images[i]), "label": int(labels[i])}
    w.done()
    w.merge()


def litdata_dataset(remote: str, local: Path, storage_options: dict[str, Any]) -> Any:
    """LitData's ``StreamingDataset`` over ``remote`` (cache in ``local``), items as tensors."""
    from litdata import StreamingDataset
    from litdata.streaming import downloader
    from litdata.streaming.resolver import Dir

    # LitData fetches chunks through obstore, whose HTTP client refuses a plain-http endpoint
    # (the loopback S3 server) unless its client option allow_http is set, and LitData has no
    # setting for it: its client options are this module constant (the same dict for every
    # store it builds, in this process and in forked workers). Over https nothing differs.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]

    class Images(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, i: Any) -> tuple[torch.Tensor, int]:
            item = super().__getitem__(i)
            return torch.as_tensor(item["image"]).permute(2, 0, 1), int(item["label"])

    client = storage_options["client_kwargs"]
    opts = {
        "endpoint_url": client["endpoint_url"],
        "aws_access_key_id": storage_options["key"],
        "aws_secret_access_key": storage_options["secret"],
    }
    return Images(Dir(path=str(local), url=remote), shuffle=True, seed=1, storage_options=opts)


# --------------------------------------------------------------------------- peer writers
# The writers of bench_pack: each turns the same image files into its own format, every image
# through the same decode + resize as the pack (h5forge's default kernel), so the figures
# compare the writers, not the decoders. Module level: the worker processes import them.


def one_thread() -> None:
    """One torch thread in this process, as the pack's workers run (a decoding process per
    core; torch's default of one thread per core would oversubscribe the machine)."""
    torch.set_num_threads(1)


def decoded_sample(path: str) -> np.ndarray:
    """The pack's own pixels for ``path``: decoded, shorter side 224, centre crop 224."""
    from h5forge.preprocess.config import ImageConfig
    from h5forge.preprocess.decode import load_pixels

    if torch.get_num_threads() != 1:  # LitData's workers: no initializer of ours
        one_thread()

    pixels, _ = load_pixels(path, ImageConfig(), resize=True)
    return np.ascontiguousarray(pixels)


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    return {"image": decoded_sample(item[0]), "label": item[1]}


def _pair(item: tuple[str, int]) -> tuple[bytes, int]:
    return decoded_sample(item[0]).tobytes(), item[1]


def optimize_litdata(files: list[str], labels: list[int], out: str, workers: int) -> None:
    """LitData's ``optimize`` with ``workers`` processes (its own pool, its own start method)."""
    shutil.rmtree(out, ignore_errors=True)  # a fresh output, as the pack replaces its file
    import litdata

    litdata.optimize(
        fn=_litdata_item,
        inputs=list(zip(files, labels, strict=True)),
        output_dir=out,
        num_workers=workers,
        chunk_bytes=SHARD_BYTES,
        mode="overwrite",
        verbose=False,
    )


def _decoded_pairs(files: list[str], labels: list[int], workers: int) -> Any:
    import multiprocessing

    pool = multiprocessing.get_context("forkserver").Pool(workers, initializer=one_thread)
    return pool, pool.imap(_pair, zip(files, labels, strict=True), chunksize=16)


def write_mds_files(files: list[str], labels: list[int], out: str, workers: int) -> None:
    """Mosaic's ``MDSWriter`` (one writer process) fed by ``workers`` decoding processes."""
    shutil.rmtree(out, ignore_errors=True)  # a fresh output, as the pack replaces its file
    streaming, _ = import_streaming()
    columns = {"image": "bytes", "label": "int"}
    pool, pairs = _decoded_pairs(files, labels, workers)
    with pool, streaming.MDSWriter(out=out, columns=columns, size_limit=SHARD_BYTES) as w:
        for data, label in pairs:
            w.write({"image": data, "label": label})


def write_wds_files(files: list[str], labels: list[int], out: str, workers: int) -> None:
    """WebDataset's ``ShardWriter`` (tar shards) fed by ``workers`` decoding processes."""
    shutil.rmtree(out, ignore_errors=True)  # a fresh output, as the pack replaces its file
    import webdataset

    Path(out).mkdir(parents=True, exist_ok=True)
    pool, pairs = _decoded_pairs(files, labels, workers)
    with pool, webdataset.ShardWriter(f"{out}/shard-%06d.tar", maxsize=SHARD_BYTES, verbose=0) as w:
        for i, (data, label) in enumerate(pairs):
            w.write({"__key__": f"{i:08d}", "image.u8": data, "cls": str(label).encode()})

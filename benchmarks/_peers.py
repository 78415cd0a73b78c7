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

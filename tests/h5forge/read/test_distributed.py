"""Two ranks with torch.distributed (gloo, loopback), each with a 2-worker loader."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from h5forge.pack.writer import PackResult
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.order import epoch_order
from tests.fixtures.sampling import batches_of, ddp_rank, interleave, pixels_to_index


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.slow
def test_two_ranks_share_one_global_order_and_resume_on_one(
    packed_decoded: PackResult, tmp_path: Path
) -> None:
    path, out = packed_decoded.path, tmp_path / "ranks.pt"
    mp.spawn(ddp_rank, args=(2, _free_port(), path, str(out)), nprocs=2, join=True)
    saved = torch.load(out, weights_only=False)
    ranks = saved["ranks"]
    n = len(H5ImageDataset(path))
    # Training: the ranks' shares are disjoint and cover the epoch (n is even: no padding).
    assert len(ranks[0]["epoch"]) == len(ranks[1]["epoch"]) == n // 2
    assert Counter(ranks[0]["epoch"] + ranks[1]["epoch"]) == Counter(range(n))
    assert interleave([r["epoch"] for r in ranks]) == epoch_order(n, seed=7, epoch=0).tolist()
    # Exact: 35 samples, each read by exactly one rank; the counts differ by one.
    assert [len(r["exact"]) for r in ranks] == [18, 17]
    assert Counter(ranks[0]["exact"] + ranks[1]["exact"]) == Counter(range(35))
    # Resume on world size 1 (torch.distributed not initialised here) from rank 0's state:
    # the same global sequence of epoch 1 continues after the 2 x 2 batches the ranks read.
    ds = H5ImageDataset(path)
    loader = ds.loader(4, shuffle=True, seed=7)
    loader.load_state_dict(saved["state"])
    assert saved["state"]["sampler"]["position"] == 2 * 2 * 4
    rest = [i for b in batches_of(loader, pixels_to_index(ds)) for i in b[0]]
    head = interleave([r["head"] for r in ranks])
    assert head + rest == epoch_order(n, seed=7, epoch=1).tolist()

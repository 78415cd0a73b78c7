"""Resume mid-epoch: save a loader's state after N batches, rebuild it in a new process, load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from h5forge.pack.writer import PackResult
from h5forge.read.dataset import H5ImageDataset
from tests.fixtures.sampling import batches_of, make_loader, pixels_to_index

ROOT = Path(__file__).resolve().parents[3]
# torchdata 0.11's StatefulDataLoader calls torch.set_vital, deprecated (a warning) in torch 2.13.
STATEFUL = pytest.param(
    "stateful", marks=pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
)


def _resume_elsewhere(tmp_path: Path, job: dict[str, object]) -> list[object]:
    torch.save(job, tmp_path / "state.pt")
    code = "import sys; from tests.fixtures.sampling import resume_main; resume_main(sys.argv[1:])"
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "state.pt"), str(tmp_path / "rest.pt")],
        cwd=ROOT,
        check=True,
        timeout=240,
    )
    rest: list[object] = torch.load(tmp_path / "rest.pt", weights_only=False)
    return rest


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["h5forge", STATEFUL])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_resumed_in_a_new_process_yields_the_rest_of_the_epoch(
    packed_decoded: PackResult, tmp_path: Path, kind: str, method: str
) -> None:
    path, done = packed_decoded.path, 3
    table = pixels_to_index(H5ImageDataset(path))
    whole = make_loader(path, kind, None)  # the order does not depend on the workers
    first_epoch = batches_of(whole, table)
    uninterrupted = batches_of(whole, table)  # epoch 1: the one interrupted below
    assert [b[0] for b in first_epoch] != [b[0] for b in uninterrupted]
    interrupted = make_loader(path, kind, method)
    batches_of(interrupted, table)  # epoch 0, whole
    head = batches_of(interrupted, table, limit=done)
    state = interrupted.state_dict()
    job = {"path": path, "kind": kind, "method": method, "sampler_kw": {}, "state": state}
    rest = _resume_elsewhere(tmp_path, job)
    assert head == uninterrupted[:done]
    assert rest == uninterrupted[done:]  # indices, pixel bytes and labels
    seen = sorted(i for indices, _, _ in head + rest for i in indices)
    assert seen == list(range(len(table)))


def test_loader_state_with_a_foreign_sampler_skips_batches(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    table = pixels_to_index(ds)
    order = list(range(len(ds)))[::-1]
    loader = ds.loader(4, sampler=order)
    head = batches_of(loader, table, limit=2)
    state = loader.state_dict()
    assert state == {"sampler": None, "batches": 2}
    again = ds.loader(4, sampler=order)
    again.load_state_dict(state)
    rest = batches_of(again, table)
    assert [i for b in head + rest for i in b[0]] == order
    assert again.state_dict() == {"sampler": None, "batches": len(batches_of(loader, table))}
    with pytest.raises(ValueError, match="not a Loader state"):
        again.load_state_dict({"batches": 1})
    with pytest.raises(ValueError, match="batches=-1 must be an int >= 0"):
        again.load_state_dict({"sampler": None, "batches": -1})

"""Campaign 3, fast subset: `h5forge pack` on the hostile corpus, the empty class, fuzzing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import discover
from tests.reliability import hostile
from tests.reliability._result import CampaignResult

pytestmark = pytest.mark.reliability


def test_corpus_is_packed_or_quarantined_without_a_traceback(tmp_path: Path) -> None:
    res = hostile.run(fuzz_examples=40, work=tmp_path, full=False)
    assert res.ok, res.summary()
    kinds = {key.split(":")[0] for key in res.outcomes}
    assert len(kinds - {"discover fuzz", "process_file fuzz"}) >= 40
    assert res.outcomes["empty class folder: EmptyDatasetError, exit 2"] == 1


def test_process_file_fuzz(tmp_path: Path) -> None:
    res = CampaignResult("hostile")
    hostile.fuzz_process_file(tmp_path, 80, res)
    assert res.ok, res.summary()


def test_link_to_an_ancestor_is_a_loop_not_a_second_copy(tmp_path: Path) -> None:
    write_image_folder(tmp_path, classes=("a", "b"), per_class=2, seed=1, size=(8, 8))
    os.symlink("..", tmp_path / "a" / "up")
    os.symlink("../..", tmp_path / "b" / "way-up")
    cat = discover(tmp_path)
    assert [s.relpath for s in cat.samples] == [
        "a/a_0000.jpg",
        "a/a_0001.png",
        "b/b_0000.jpg",
        "b/b_0001.png",
    ]
    assert cat.skipped["revisited-folder"] == 2


def test_listing_attacks_are_refused_naming_file_and_line(tmp_path: Path) -> None:
    res = CampaignResult("hostile")
    hostile.listing_attacks(tmp_path, res)
    assert res.ok, res.summary()
    assert res.trials == len(hostile.LISTING_ATTACKS) >= 30

"""Campaign 7, fast subset: hostile .h5 kinds through every entry point in bounded children."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.hostile_h5 import KINDS
from tests.reliability import hostile_h5

pytestmark = pytest.mark.reliability

# One kind of each family: out-of-file references (a FIFO among them), declared sizes, labels,
# byte ranges, shapes that overflow, a chunk larger than the file, and one harmless kind.
_SUBSET = (
    "ext-storage-fifo-labels",
    "ext-link-nested",
    "vds-labels",
    "soft-link-classes",
    "index-beyond-file",
    "labels-huge-chunk",
    "label-2-40",
    "range-overflow",
    "shapes-overflow-encoded",
    "images-huge-filtered",
    "hardlink-cycle",
)


def test_the_campaign_has_at_least_30_kinds() -> None:
    assert len({k.name for k in KINDS}) == len(KINDS) >= 30
    assert set(_SUBSET) <= {k.name for k in KINDS}


def test_subset_is_refused_in_bounded_children(tmp_path: Path) -> None:
    res = hostile_h5.run(work=tmp_path, kinds=_SUBSET, cli=False, trial_seconds=60)
    assert res.ok, res.summary()
    # every library entry point saw every kind: local reader, HTTP reader, verify, inspect
    assert res.trials == len(_SUBSET) * len(hostile_h5.LIB_ENTRIES)
    refused = sum(v for k, v in res.outcomes.items() if "IntegrityError naming" in k)
    assert refused == (len(_SUBSET) - 1) * len(hostile_h5.LIB_ENTRIES)

"""Campaign 6, fast subset: racing publishers with readers and a re-verifier watching."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.reliability import concurrency

pytestmark = pytest.mark.reliability


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return concurrency.make_assets(tmp_path_factory.mktemp("race-assets"))


@pytest.mark.parametrize("kind", concurrency.KINDS)
def test_race_ends_whole_and_consistent(assets: dict[str, Path], tmp_path: Path,
                                        kind: str) -> None:
    seen, problems = concurrency.run_trial(kind, assets, tmp_path, 0, random.Random(0))
    assert not problems, problems
    assert seen.get("read: whole", 0) >= 1

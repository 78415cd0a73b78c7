"""Campaign 6, fast subset: racing publishers with readers and a re-verifier watching; racing
and killed packs."""

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
def test_race_ends_whole_and_consistent(assets: dict[str, Path], tmp_path: Path, kind: str) -> None:
    seen, problems = concurrency.run_trial(kind, assets, tmp_path, 0, random.Random(0))
    assert not problems, problems
    assert seen.get("read: whole", 0) >= 1


@pytest.fixture(scope="module")
def pack_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return concurrency.make_pack_source(tmp_path_factory.mktemp("pack-src"))


@pytest.mark.parametrize("kind", concurrency.PACK_KINDS)
def test_packs_to_one_output_race_and_die_cleanly(
    pack_source: Path, tmp_path: Path, kind: str
) -> None:
    seen, problems = concurrency.run_pack_trial(kind, pack_source, tmp_path, 0, random.Random(0))
    assert not problems, problems
    assert seen.get("re-run: packed" if kind == "pack-killed" else "pack: won") == 1

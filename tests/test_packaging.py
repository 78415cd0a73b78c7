"""The extras in ``pyproject.toml``: ``all`` and ``test`` cover the others; no self-reference."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
    "optional-dependencies"
]
# What `all` leaves out on purpose: torchvision pins its own torch; the peers are benchmarks'.
NOT_IN_ALL = {"vision", "bench", "all"}
# What the test suite exercises besides its own tools.
IN_TEST = {"pipeline", "s3", "http", "plugins", "dask", "docs"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_no_extra_names_h5forge_itself(extra: str) -> None:
    assert "h5forge" not in _names(EXTRAS[extra]), f"[{extra}] refers to h5forge's own extras"


@pytest.mark.parametrize("extra", sorted(set(EXTRAS) - NOT_IN_ALL))
def test_all_holds_every_extra(extra: str) -> None:
    assert _names(EXTRAS[extra]) <= _names(EXTRAS["all"]), sorted(
        _names(EXTRAS[extra]) - _names(EXTRAS["all"])
    )


@pytest.mark.parametrize("extra", sorted(IN_TEST))
def test_test_holds_what_the_suite_exercises(extra: str) -> None:
    assert _names(EXTRAS[extra]) <= _names(EXTRAS["test"]), sorted(
        _names(EXTRAS[extra]) - _names(EXTRAS["test"])
    )

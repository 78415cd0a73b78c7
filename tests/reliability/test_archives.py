"""Campaign 4, fast subset: the whole attack table through safe_extract and fetch over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability import archive_attacks

pytestmark = pytest.mark.reliability


def test_every_attack_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    res = archive_attacks.run(work=tmp_path)
    assert res.ok, res.summary()
    assert res.trials == 2 * len(archive_attacks.TABLE) >= 80
    assert res.lost == 0

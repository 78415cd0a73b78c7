"""Property tests of the pack's stored configuration documents (issue 28): a file's
``config_json`` (:meth:`PackConfig.from_json`) and its lineage attributes
(:func:`check_lineage`), read from files someone else may have written. Any text gives a value
or a ``ValueError`` (the documented error of both), never another exception, never a hang."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from h5forge.asset import format as fmt
from h5forge.pack.attrs import check_lineage
from h5forge.pack.config import PackConfig
from tests.fixtures.documents import TEXT, attempt, document_text, examples

CONFIG = json.loads(PackConfig().to_json())
CHANGES = {"added": 1, "removed": 0, "replaced": 2}
_LINEAGE_VALUES = TEXT | st.sampled_from(["ab" * 32, "AB" * 32, "ab" * 31]) | document_text(CHANGES)


@examples(100)
@given(text=document_text(CONFIG))
def test_a_stored_pack_config_reads_or_raises_value_error(text: str) -> None:
    config, error = attempt(lambda: PackConfig.from_json(text), ValueError)
    if error is not None:
        return
    assert PackConfig.from_json(config.to_json()) == config  # what is read is a valid config


@examples(100)
@given(
    lineage=st.none()
    | st.dictionaries(
        st.sampled_from(sorted(fmt.OPTIONAL_ATTRS)) | TEXT,
        _LINEAGE_VALUES | st.integers() | st.none(),
        max_size=5,
    )
)
def test_lineage_attributes_check_or_raise_value_error(lineage: dict[str, Any] | None) -> None:
    found, error = attempt(lambda: check_lineage(lineage), ValueError)
    if error is not None:
        return
    assert set(found) <= fmt.OPTIONAL_ATTRS
    assert all(isinstance(v, str) for v in found.values())

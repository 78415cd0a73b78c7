"""Property test of a file's stored target schema (issue 28): :func:`parse_schema` takes any
``targets_json`` text and gives a schema or a ``ValueError`` naming where it was read (its
documented error), never another exception."""

from __future__ import annotations

import json

from hypothesis import given

from h5forge.targets.schema import Column, check_schema, parse_schema, schema_json
from tests.fixtures.documents import attempt, document_text, examples

SCHEMA = json.loads(
    schema_json(
        [
            Column("boxes", "boxes", classes=("a", "b")),
            Column("segmentation", "mask"),
            Column("tags", "multilabel", classes=("x",)),
            Column("caption", "text"),
        ]
    )
)


@examples(100)
@given(text=document_text(SCHEMA))
def test_a_stored_target_schema_parses_or_raises_value_error(text: str) -> None:
    schema, error = attempt(lambda: parse_schema(text, where="f.h5"), ValueError)
    if error is not None:
        assert str(error).startswith("f.h5")
        return
    check_schema(schema)
    assert all(isinstance(c, Column) for c in schema)
    assert parse_schema(schema_json(schema), where="f.h5") == schema

"""Property test of the stored image configuration (issue 28): :meth:`ImageConfig.from_json`
and :meth:`ImageConfig.from_dict` take any text or JSON value and give a valid configuration or
a ``ValueError`` (their documented error), never another exception."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given

from h5forge.preprocess.config import ImageConfig
from tests.fixtures.documents import JSON_VALUES, attempt, document_text, examples, mutated

IMAGE = json.loads(ImageConfig().to_json())


@examples(100)
@given(text=document_text(IMAGE))
@example(text="NaN")  # found by this property: a TypeError ("not a mapping") before the fix
@example(text='{"layout": "decoded", "colour": "RGB"}')  # and an unknown field: TypeError
def test_a_stored_image_config_reads_or_raises_value_error(text: str) -> None:
    config, error = attempt(lambda: ImageConfig.from_json(text), ValueError)
    if error is not None:
        return
    assert ImageConfig.from_json(config.to_json()) == config


@examples(100)
@given(data=mutated(IMAGE) | JSON_VALUES)
@example(data=None)
@example(data=[["layout", "decoded"]])
@example(data={**IMAGE, "": 1})
def test_an_image_config_dict_reads_or_raises_value_error(data: Any) -> None:
    config, error = attempt(lambda: ImageConfig.from_dict(data), ValueError)
    if error is not None:
        return
    assert ImageConfig.from_dict(config.to_dict()) == config

"""BuildConfig -> PackConfig: every pack option of the form reaches the library, refused early."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from h5forge.flows.config import BuildConfig
from h5forge.pack.config import PackConfig
from h5forge.preprocess.config import ImageConfig

GOOD: dict[str, Any] = {"source": "/data/flowers", "destination": "/assets/flowers.h5"}


def test_pack_config_carries_every_image_and_codec_option() -> None:
    config = BuildConfig(
        **GOOD,
        layout="decoded",
        resize="resize",
        size=64,
        width=96,
        mode="L",
        quality=55,
        max_image_pixels=10**6,
        compression="gzip",
        compression_level=2,
        fletcher32=True,
    )
    assert config.pack_config() == PackConfig(
        ImageConfig(
            layout="decoded",
            resize="resize",
            size=(64, 96),
            mode="L",
            quality=55,
            max_image_pixels=10**6,
        ),
        compression="gzip",
        compression_level=2,
        fletcher32=True,
    )


def test_pack_config_keeps_quality_and_shorter_side() -> None:
    config = BuildConfig(**GOOD, layout="encoded", encoding="jpeg", quality=70, shorter_side=300)
    image = config.pack_config().image
    assert (image.encoding, image.quality, image.shorter_side) == ("jpeg", 70, 300)


def test_the_form_and_the_library_write_one_config_json() -> None:
    # Two changes of form: the UI's fields -> PackConfig -> the config_json attribute.
    config = BuildConfig(**GOOD, compression="lzf")
    assert config.pack_config().to_json() == PackConfig(compression="lzf").to_json()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"compression": "zstd", "compression_level": 0}, "out of range for zstd"),
        ({"resize": "none", "fletcher32": True}, "fletcher32=True applies to decoded images"),
        ({"layout": "encoded", "compression": "lzf"}, "one size only"),
    ],
)
def test_a_bad_combination_is_refused_when_the_form_is_submitted(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        BuildConfig(**GOOD, **changes)

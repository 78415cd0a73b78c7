"""PackConfig: validation up front, the config_json round trip, the digest, the filter options."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import h5py
import pytest

from h5forge.errors import MissingExtraError
from h5forge.options import OptionError
from h5forge.pack.config import COMPRESSIONS, PackConfig
from h5forge.preprocess.config import ImageConfig

DECODED = ImageConfig(resize="resize", size=(24, 32))
BLOB = ImageConfig(layout="encoded", resize="none", size=None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"compression": "zstd", "compression_level": 0}, r"compression_level=0 is out of range"),
        ({"compression": "gzip", "compression_level": 12}, r"out of range for gzip \(0\.\.9\)"),
        ({"compression_level": 3}, r"compression_level=3 needs a codec"),
        ({"compression": "brotli"}, r"compression='brotli' is not one of"),
        ({"image": BLOB, "compression": "gzip"}, r"applies to decoded images of one size only"),
        ({"image": BLOB, "fletcher32": True}, r"fletcher32=True applies to decoded images"),
        ({"fletcher32": 1}, r"fletcher32=1 must be true or false"),
        ({"image": "decoded"}, r"must be an ImageConfig"),
    ],
)
def test_a_bad_combination_is_refused_when_made(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        PackConfig(**kwargs)


def test_none_is_the_codec_none() -> None:
    assert PackConfig(compression=None) == PackConfig()  # type: ignore[arg-type]
    assert PackConfig().compression == "none"


@pytest.mark.parametrize(
    "config",
    [
        PackConfig(),
        PackConfig(DECODED, compression="gzip", compression_level=1),
        PackConfig(DECODED, compression="lzf", fletcher32=True),
        PackConfig(DECODED, compression="zstd"),
        PackConfig(BLOB),
        PackConfig(ImageConfig(layout="encoded", encoding="jpeg", quality=70, shorter_side=256)),
    ],
)
def test_from_json_reads_to_json_back(config: PackConfig) -> None:
    assert PackConfig.from_json(config.to_json()) == config
    assert PackConfig.from_json(config.to_json()).to_json() == config.to_json()


def test_to_json_is_the_config_json_the_writer_always_wrote() -> None:
    # Existing assets and FORMAT.md carry this exact string: the canonical JSON of the image
    # policy and the codec settings, sorted keys, no spaces.
    image = ImageConfig(resize="resize", size=(24, 32))
    want = json.dumps(
        {
            "image": json.loads(image.to_json()),
            "compression": "gzip",
            "compression_level": 1,
            "fletcher32": True,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    config = PackConfig(image, compression="gzip", compression_level=1, fletcher32=True)
    assert config.to_json() == want
    assert config.to_json().startswith('{"compression":"gzip","compression_level":1,')


def test_sha256_is_stable_and_covers_every_field() -> None:
    # Part sidecars record this value (find_done_parts compares it), as do published assets
    # (no-op builds compare it): these are the digests h5forge.scale.shards.shard_config_sha256
    # gave before PackConfig, so an older run's asset still counts as unchanged.
    # The Pillow path (decoder and resample "pillow") keeps them: its pixels are those files'.
    pillow = {"decoder": "pillow", "resample": "pillow"}
    old = PackConfig(
        ImageConfig(resize="resize", size=(24, 32), **pillow),
        compression="gzip",
        compression_level=6,
    )
    assert old.sha256() == "3c37fe69ab30620bc92b65d895f413230f165443b91d47e2555c1e8c7d1d39b3"
    assert PackConfig(ImageConfig(**pillow)).sha256() == (
        "dba7617d07a4bc9f897907a84a66b694054d80ff4cec3ed5a11a4d154cbdc954"
    )
    # The default decoder and kernel (issue 31) change the pixels, so the digest: an asset
    # packed before re-packs once.
    config = PackConfig(DECODED, compression="gzip", compression_level=6)
    assert config.sha256() == "e3707b727a118fa721f00d25d120005670f295bdccadebbcc7ca4f8d9785abee"
    assert PackConfig().sha256() == (
        "88efe6733dac43929e48890400b0a5aa072c1f9beb8a2dd5526627b2e0073c85"
    )
    assert config.sha256() == hashlib.sha256(config.to_json().encode()).hexdigest()
    others = {
        PackConfig(DECODED).sha256(),
        PackConfig(DECODED, compression="lzf").sha256(),
        PackConfig(DECODED, fletcher32=True).sha256(),
        PackConfig(DECODED, compression="gzip").sha256(),
        config.sha256(),
        old.sha256(),
        PackConfig(ImageConfig(resize="resize", size=(24, 33))).sha256(),
        PackConfig(ImageConfig(resize="resize", size=(24, 32), decoder="pillow")).sha256(),
        PackConfig(ImageConfig(resize="resize", size=(24, 32), resample="pillow")).sha256(),
    }
    assert len(others) == 9


def test_from_json_refuses_what_is_not_a_pack_configuration() -> None:
    with pytest.raises(ValueError, match="is not a pack configuration"):
        PackConfig.from_json('{"image": {}}')
    with pytest.raises(ValueError, match="is not a pack configuration"):
        PackConfig.from_json("not json")


@pytest.mark.parametrize(
    ("compression", "level", "fletcher32", "want"),
    [
        ("none", None, False, {}),
        ("none", None, True, {"fletcher32": True}),
        ("lzf", None, False, {"compression": "lzf"}),
        ("gzip", None, False, {"compression": "gzip", "compression_opts": 4}),
        ("gzip", 1, True, {"compression": "gzip", "compression_opts": 1, "fletcher32": True}),
    ],
)
def test_filter_kwargs_per_codec(
    compression: Any, level: int | None, fletcher32: bool, want: dict[str, Any]
) -> None:
    config = PackConfig(
        DECODED, compression=compression, compression_level=level, fletcher32=fletcher32
    )
    assert config.filter_kwargs() == want


@pytest.mark.parametrize(("compression", "filter_id"), [("blosc-lz4", 32001), ("zstd", 32015)])
def test_filter_kwargs_of_the_plugin_codecs(compression: Any, filter_id: int) -> None:
    pytest.importorskip("hdf5plugin")
    kwargs = PackConfig(DECODED, compression=compression).filter_kwargs()
    assert kwargs["compression"] == filter_id


def test_a_missing_plugin_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hdf5plugin", None)  # import now raises ImportError
    config = PackConfig(DECODED, compression="zstd")  # valid: the plugin is needed to write
    with pytest.raises(MissingExtraError, match=r"h5forge\[plugins\]"):
        config.filter_kwargs()


def test_compression_attr() -> None:
    assert PackConfig().compression_attr == "none"
    assert PackConfig(DECODED, compression="gzip").compression_attr == "gzip"
    assert PackConfig(DECODED, compression="gzip", compression_level=1).compression_attr == "gzip-1"
    assert PackConfig(DECODED, fletcher32=True).compression_attr == "none+fletcher32"
    assert set(COMPRESSIONS) == {"none", "gzip", "lzf", "blosc-lz4", "zstd"}


def test_filters_apply_to_h5py(tmp_path: Any) -> None:
    config = PackConfig(DECODED, compression="gzip", compression_level=2, fletcher32=True)
    with h5py.File(tmp_path / "f.h5", "w") as h5:
        ds = h5.create_dataset(
            "x", shape=(2, 4), chunks=(1, 4), dtype="u1", **config.filter_kwargs()
        )
        assert (ds.compression, ds.compression_opts, ds.fletcher32) == ("gzip", 2, True)


def test_the_file_records_the_config_it_was_packed_with(split_tree: Any, tmp_path: Any) -> None:
    from h5forge.asset import format as fmt
    from h5forge.pack.writer import pack

    config = PackConfig(DECODED, compression="gzip", compression_level=1, fletcher32=True)
    packed = pack(split_tree, tmp_path / "c.h5", config=config, workers=1)
    with h5py.File(packed.path) as h5:
        assert h5.attrs[fmt.A_CONFIG_JSON] == config.to_json()
        assert h5.attrs[fmt.A_CONFIG_SHA256] == config.sha256()
        assert h5.attrs[fmt.A_COMPRESSION] == "gzip-1+fletcher32"
        assert PackConfig.from_json(h5.attrs[fmt.A_CONFIG_JSON]) == config


def test_pack_refuses_a_config_that_is_not_a_pack_config(split_tree: Any, tmp_path: Any) -> None:
    from h5forge.pack.writer import pack

    with pytest.raises(TypeError, match="must be a PackConfig"):
        pack(split_tree, tmp_path / "x.h5", config=DECODED)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())

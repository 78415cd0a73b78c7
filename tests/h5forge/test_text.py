"""printable(): untrusted names are shown escaped, readable, on one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5forge.text import printable


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("plain name.jpg", "plain name.jpg"),
        ("café/猫.png", "café/猫.png"),
        ("evil\x1b[2J\x1b]52;c;aGk=\x07.jpg", "evil\\x1b[2J\\x1b]52;c;aGk=\\x07.jpg"),
        ("line\nbreak\rover\ttab", "line\\nbreak\\rover\\ttab"),
        ("del\x7fc1\x9bcsi", "del\\x7fc1\\x9bcsi"),
        ("photo\u202egpj.exe", "photo\\u202egpj.exe"),
        ("iso\u2066late\u2069", "iso\\u2066late\\u2069"),
        ("\ufeffbom\u200bzw", "\\ufeffbom\\u200bzw"),
        ("sep\u2028para\u2029", "sep\\u2028para\\u2029"),
        ("back\\slash\\x1b", "back\\\\slash\\\\x1b"),
        ("nul\x00", "nul\\x00"),
        (b"bytes\xff\xfe.jpg", "bytes\\xff\\xfe.jpg"),
        (Path("dir") / "a\x1bb", "dir/a\\x1bb"),
        (12, "12"),
    ],
)
def test_printable_escapes_exactly_the_unsafe_characters(name: object, shown: str) -> None:
    assert printable(name) == shown


def test_surrogateescaped_filename_shows_its_bytes_and_encodes() -> None:
    name = b"caf\xe9.jpg".decode("utf-8", "surrogateescape")  # what os.listdir gives
    shown = printable(name)
    assert shown == "caf\\xe9.jpg"
    shown.encode("utf-8")  # a lone surrogate would raise here


def test_output_is_one_printable_line_for_every_code_point_class() -> None:
    every = "".join(chr(c) for c in range(0x3000) if not 0xD800 <= c < 0xDC80)
    shown = printable(every, limit=None)
    assert shown.isprintable()
    assert "\x1b" not in shown
    assert "\n" not in shown


def test_long_names_keep_head_and_tail() -> None:
    name = "a" * 100_000 + "\x1b" + "tail.jpg"
    shown = printable(name, limit=40)
    assert shown.startswith("a" * 20)
    assert shown.endswith("\\x1btail.jpg")
    assert "characters omitted" in shown
    assert len(shown) < 100
    assert printable(name, limit=None).count("a") == 100_001

"""The one parser of untrusted JSON documents: nesting bounded before parsing, one error type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h5forge.documents import MAX_JSON_DEPTH, DocumentError, _nesting, parse_json
from h5forge.errors import UnsafePathError
from h5forge.locks import lock_file


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


# Strings full of what a scanner could mistake for structure: quotes, backslashes, brackets.
_TRICKY = st.text(alphabet='[]{}"\\abc\n\u00e9', max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY, inner, max_size=4),
    max_leaves=60,
)


@given(_JSON)
def test_the_scan_measures_the_depth_of_any_json_document(value: Any) -> None:
    # Past the shortcut (at most MAX_JSON_DEPTH brackets cannot nest deeper), the scan's
    # count is the document's true depth, whatever its strings hold.
    for ascii_only in (True, False):
        raw = json.dumps(value, ensure_ascii=ascii_only).encode()
        if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
            assert _nesting(raw) == _depth(value)
        else:
            assert _nesting(raw) == 0 or _nesting(raw) == _depth(value)


def test_the_bound_is_exact_and_brackets_in_strings_do_not_count() -> None:
    at_bound = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert _depth(parse_json(at_bound, what="doc")) == MAX_JSON_DEPTH
    with pytest.raises(DocumentError, match=f"doc 'x.json' .* nests more than {MAX_JSON_DEPTH}"):
        parse_json("[" + at_bound + "]", what="doc", name="x.json")
    quoted = json.dumps(["[" * 500 + '\\"{', {"k": "]" * 9}])
    assert parse_json(quoted, what="doc") == json.loads(quoted)
    wide = json.dumps([[i] for i in range(10_000)])  # many brackets, two levels
    assert len(parse_json(wide.encode(), what="doc")) == 10_000


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"[" * 100_000, "nests more than 32 levels deep"),  # RecursionError before
        (b'{"a": ' + b"9" * 5000 + b"}", r"not JSON \(ValueError"),  # int digits limit
        (b'{"a": "\xff"}', r"not JSON \(UnicodeDecodeError"),
        (b"{not json", r"not JSON \(JSONDecodeError"),
    ],
)
def test_every_failure_is_one_error_naming_the_document(raw: bytes, words: str) -> None:
    with pytest.raises(DocumentError, match=rf"^pointer 'mem://a/b' (is )?.*{words}"):
        parse_json(raw, what="pointer", name="mem://a/b")
    assert issubclass(DocumentError, ValueError)  # callers that catch ValueError still do


def test_a_lock_file_holding_deep_json_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    lock = tmp_path / "out.h5.lock"
    lock.write_bytes(b"[" * 100_000)
    with (
        pytest.raises(UnsafePathError, match="not an h5forge lock file"),
        lock_file(lock, wait=False),
    ):
        pass

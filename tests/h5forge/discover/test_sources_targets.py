"""Listings with target columns: inferred and given schemas, round trips, hostile rows."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h5forge.discover.catalog import UNLABELLED, Catalog, discover
from h5forge.discover.listing import MAX_LINE_BYTES
from h5forge.discover.report import describe
from h5forge.targets.schema import KINDS as KINDS_LIST
from h5forge.targets.schema import MAX_TEXT_BYTES, Column, check_value
from tests.fixtures.targets_data import sample_rows, write_listing_with_columns

KINDS = {
    "tags": "multilabel",
    "caption": "text",
    "score": "number",
    "count": "number",
    "boxes": "boxes",
    "mask": "mask",
}


def _expected(root: Path, rows: list[dict[str, object]], cat: Catalog) -> dict[str, tuple]:
    """What each row must become, by the documented conversions, from the rows as written."""
    tag_names = sorted({t for r in rows for t in r["tags"]})  # type: ignore[attr-defined]
    box_names = sorted({b[4] for r in rows for b in r["boxes"]})  # type: ignore[attr-defined]
    by_name = {c.name: c for c in cat.schema}
    assert by_name["tags"].classes == tuple(tag_names)
    assert by_name["boxes"].classes == tuple(box_names)
    out = {}
    for r in rows:
        out[r["path"]] = (
            tuple(tag_names.index(t) for t in r["tags"]),  # type: ignore[attr-defined]
            r["caption"],
            r["score"],
            r["count"],
            tuple(
                (*map(float, b[:4]), float(box_names.index(b[4])), 0.0)
                for b in r["boxes"]  # type: ignore[attr-defined]
            ),
            str(root / str(r["mask"])),
        )
    return out


def _targets(cat: Catalog) -> dict[str, tuple]:
    return {s.relpath: s.targets for s in cat.samples}


def test_jsonl_columns_are_inferred_and_round_trip(tmp_path: Path) -> None:
    rows = sample_rows(7)
    w = write_listing_with_columns(tmp_path, rows)
    cat = discover(tmp_path, listing=w.listing.name)
    assert [(c.name, c.kind, c.dtype) for c in cat.schema] == [
        ("tags", "multilabel", None),
        ("caption", "text", None),
        ("score", "number", "float64"),
        ("count", "number", "int64"),
        ("boxes", "boxes", None),
        ("mask", "mask", None),
    ]
    assert cat.classes == (UNLABELLED,)
    assert {s.label for s in cat.samples} == {0}
    assert cat.rejected == ()
    assert _targets(cat) == _expected(tmp_path, rows, cat)
    assert [s.relpath for s in cat.samples] == sorted(r["path"] for r in rows)
    assert discover(tmp_path, listing=w.listing.name) == cat
    text = describe(cat)
    assert text.startswith("targets: tags (multilabel, 3 classes), caption (text)")
    assert "class (" not in text
    assert "count (number, int64)" in text


def test_csv_with_given_columns_round_trips_like_jsonl(tmp_path: Path) -> None:
    rows = sample_rows(6, seed=3)
    w = write_listing_with_columns(tmp_path, rows, name="m.csv")
    cat = discover(tmp_path, listing="m.csv", columns=KINDS)
    assert [c.name for c in cat.schema] == list(KINDS)
    assert _targets(cat) == _expected(tmp_path, rows, cat)
    assert w.listing.read_text().startswith("path,tags,caption")
    # without columns=, CSV infers numbers and text; a multilabel column needs columns=
    inferred = {c.name: (c.kind, c.dtype) for c in discover(tmp_path, listing="m.csv").schema}
    assert inferred["tags"] == ("text", None)
    assert inferred["score"] == ("number", "float64")
    assert inferred["count"] == ("number", "int64")
    assert inferred["mask"] == ("mask", None)


def test_labels_with_targets_and_column_selection(tmp_path: Path) -> None:
    rows = [dict(r, label=["b", "a"][i % 2]) for i, r in enumerate(sample_rows(4))]
    write_listing_with_columns(tmp_path, rows)
    cat = discover(tmp_path, listing="listing.jsonl", columns={"caption": "text"})
    assert cat.classes == ("a", "b")
    assert [c.name for c in cat.schema] == ["caption"]
    want = {r["path"]: (cat.classes.index(r["label"]), (r["caption"],)) for r in rows}
    assert {s.relpath: (s.label, s.targets) for s in cat.samples} == want
    assert describe(cat) == "targets: class (2 classes), caption (text)"
    plain = discover(tmp_path, listing="listing.jsonl", columns={})
    assert plain.schema == ()
    assert {s.targets for s in plain.samples} == {()}
    with pytest.raises(ValueError, match=r"columns= names \['capton'\].*does not have"):
        discover(tmp_path, listing="listing.jsonl", columns={"capton": "text"})
    with pytest.raises(ValueError, match="give listing= too"):
        discover(tmp_path, columns={"caption": "text"})


def _hostile_rows(tmp_path: Path) -> list[dict[str, object]]:
    (tmp_path / "outside").mkdir()
    outside = tmp_path / "outside" / "m.png"
    outside.write_bytes(b"\x89PNG")
    root = tmp_path / "ds"
    (root / "masks").mkdir(parents=True)
    os.symlink(outside, root / "masks" / "link.png")
    os.mkfifo(root / "masks" / "fifo.png")
    good = {"caption": "fine", "boxes": [[1, 2, 3, 4, "cat"]], "mask": "masks/ok.png"}
    bad = [
        ("nan", {"boxes": [[math.nan, 2, 3, 4, "cat"]]}),
        ("negative", {"boxes": [[5, 2, 3, 4, "cat"]]}),
        ("unknown-class", {"boxes": [[1, 2, 3, 4, "zebra"]]}),
        ("long-caption", {"caption": "x" * (MAX_TEXT_BYTES + 1)}),
        ("missing-mask", {"mask": "masks/missing.png"}),
        ("escaping-mask", {"mask": "../outside/m.png"}),
        ("linked-mask", {"mask": "masks/link.png"}),
        ("fifo-mask", {"mask": "masks/fifo.png"}),
        ("no-caption", {"caption": None}),
    ]
    rows = [dict(good, path="imgs/good0.png")]
    rows += [dict(good, path=f"imgs/{name}.png", **change) for name, change in bad]
    return [*rows, dict(good, path="imgs/good1.png")]


REASONS = {
    "nan": "not finite",
    "negative": "negative size",
    "unknown-class": "box 0 class 'zebra' is not one of the column's classes",
    "long-caption": f"more than the limit of {MAX_TEXT_BYTES:,}",
    "missing-mask": "not found",
    "escaping-mask": "stay inside",
    "linked-mask": "outside the listing's folder",
    "fifo-mask": "FIFO",
    "no-caption": "no value on this row",
}


@pytest.mark.parametrize("name", ["m.jsonl", "m.csv"])
def test_hostile_rows_are_quarantined_with_a_reason_and_the_rest_kept(
    tmp_path: Path, name: str
) -> None:
    rows = _hostile_rows(tmp_path)
    root = tmp_path / "ds"
    write_listing_with_columns(root, rows, name=name)
    columns = {
        "caption": "text",
        "boxes": Column("boxes", "boxes", classes=("cat", "dog")),
        "mask": "mask",
    }
    cat = discover(root, listing=name, columns=columns)
    csv = name.endswith(".csv")
    reasons = {k: v for k, v in REASONS.items() if not (csv and k == "no-caption")}
    kept = ["imgs/good0.png", "imgs/good1.png"] + (["imgs/no-caption.png"] if csv else [])
    assert [s.relpath for s in cat.samples] == kept  # an empty CSV field is the text ""
    assert cat.samples[0].targets == (
        "fine",
        ((1.0, 2.0, 3.0, 4.0, 0.0, 0.0),),
        str(root / "masks/ok.png"),
    )
    rejected = dict(cat.rejected)
    assert list(rejected) == [f"imgs/{n}.png" for n in reasons]
    for line, (kind, want) in enumerate(reasons.items(), start=2 if csv else 1):
        reason = rejected[f"imgs/{kind}.png"]
        assert reason.startswith("bad target: column "), reason
        assert want in reason, (kind, reason)
        assert reason.endswith(f"{name}:{line + 1})"), reason
    assert describe(cat).endswith(f"; {len(reasons)} quarantined")


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (
            [{"path": "a.png", "x": 1}, {"path": "b.png", "x": ["u"]}],
            r"m\.jsonl:2: column 'x' holds \['u'\] \(multilabel\), but line 1 holds a int",
        ),
        ([{"path": "a.png", "x": True}], r"m\.jsonl:1: column 'x' holds True .*no target kind"),
        ([{"path": "a.png", "x": None}], r"m\.jsonl: column 'x' is null on every line"),
        ([{"path": "a.png", "Bad Name": "t"}], r"m\.jsonl: target column 'Bad Name'.*rename"),
        ([{"path": "a.png", "index": "t"}], r"reserved"),
        (
            [{"path": "a.png", "label": "c", "t": "x"}, {"path": "b.png", "t": "y"}],
            r"m\.jsonl:2: give a label on every line or on none",
        ),
        ([{"path": "a.png", **{f"c{i}": 1 for i in range(17)}}], r"more than 16 columns"),
    ],
)
def test_structural_errors_name_file_line_and_fix(
    tmp_path: Path, lines: list[dict[str, object]], match: str
) -> None:
    write_listing_with_columns(tmp_path, lines, name="m.jsonl")
    with pytest.raises(ValueError, match=match):
        discover(tmp_path, listing="m.jsonl")


def test_label_is_required_without_target_columns(tmp_path: Path) -> None:
    write_listing_with_columns(tmp_path, [{"path": "a.png"}], name="m.csv")
    with pytest.raises(ValueError, match=r"lacks \['label'\]"):
        discover(tmp_path, listing="m.csv")
    (tmp_path / "n.csv").write_text("path,caption\na.png,hi\n")
    with pytest.raises(ValueError, match="neither labels nor target columns"):
        discover(tmp_path, listing="n.csv", columns={})
    assert discover(tmp_path, listing="n.csv").samples[0].targets == ("hi",)


@pytest.mark.parametrize("name", ["m.jsonl", "m.csv"])
def test_a_ten_megabyte_caption_refuses_the_listing_naming_the_line(
    tmp_path: Path, name: str
) -> None:
    """Over MAX_LINE_BYTES a line cannot be parsed into a row to quarantine: the bound holds."""
    rows = [{"path": "a.png", "caption": "ok"}, {"path": "b.png", "caption": "x" * 10**7}]
    write_listing_with_columns(tmp_path, rows, name=name)
    assert MAX_LINE_BYTES < 10**7
    with pytest.raises(ValueError, match=rf"m\.{name[2:]}:\d: .*(longer than|field)"):
        discover(tmp_path, listing=name)


def test_every_row_quarantined_is_an_empty_dataset(tmp_path: Path) -> None:
    write_listing_with_columns(tmp_path, [{"path": "a.png", "n": 1.5}], name="m.jsonl")
    with pytest.raises(ValueError, match="every row was quarantined.*expected an integer"):
        discover(tmp_path, listing="m.jsonl", columns={"n": Column("n", "number", dtype="int64")})
    (tmp_path / "m.jsonl").write_text(json.dumps({"path": "a.png", "n": 2}) + "\n")
    assert discover(tmp_path, listing="m.jsonl").samples[0].targets == (2,)


@pytest.mark.parametrize(
    ("tags", "reason"),
    [
        ("a||b", "class name of 0 characters, outside 1..1,024"),
        ("a|" + "n" * 2000, "class name of 2,000 characters, outside 1..1,024"),
    ],
)
def test_multilabel_names_are_bounded(tmp_path: Path, tags: str, reason: str) -> None:
    (tmp_path / "m.csv").write_text(f"path,tags\na.png,a|b\nb.png,{tags}\n")
    write_listing_with_columns(tmp_path, [{"path": "a.png"}, {"path": "b.png"}], name="x.csv")
    cat = discover(tmp_path, listing="m.csv", columns={"tags": "multilabel"})
    assert cat.schema[0].classes == ("a", "b")  # the bad names make no class
    assert [s.targets for s in cat.samples] == [((0, 1),)]
    where = tmp_path / "m.csv"
    assert cat.rejected == (("b.png", f"bad target: column 'tags': {reason} ({where}:3)"),)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
_NAMES = st.sampled_from(["tags", "caption", "score", "boxes", "mask", "x_mask", "Bad", "split2"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.dictionaries(_NAMES, _JSON, max_size=4), min_size=1, max_size=4),
    kinds=st.none() | st.dictionaries(_NAMES, st.sampled_from(KINDS_LIST), max_size=3),
    fmt=st.sampled_from(["m.jsonl", "m.csv"]),
)
def test_any_column_values_give_a_catalog_or_a_clear_error(rows, kinds, fmt) -> None:  # type: ignore[no-untyped-def]
    """Whatever the extra columns hold, discovery returns a catalog whose targets passed
    check_value, or raises ValueError / FileNotFoundError: never another exception."""
    with tempfile.TemporaryDirectory() as tmp:
        full = [dict(r, path=f"i{i}.png") for i, r in enumerate(rows)]
        write_listing_with_columns(tmp, full, name=fmt, size=(4, 4), mask_columns=())
        try:
            cat = discover(tmp, listing=fmt, columns=kinds)
        except (ValueError, FileNotFoundError) as e:
            error: Exception | None = e
        else:
            error = None
        if error is not None:
            assert str(Path(tmp, fmt)) in str(error), error  # names the listing
            return
        assert len(cat.samples) + len(cat.rejected) == len(rows)
        for s in cat.samples:
            assert len(s.targets) == len(cat.schema)
            for column, value in zip(cat.schema, s.targets, strict=True):
                assert check_value(column, value) == value
        for _, reason in cat.rejected:
            assert reason.startswith("bad target: ")
            assert reason.endswith(")")

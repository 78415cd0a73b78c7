"""One option vocabulary: every pack option in ``pack``, ``build``, ``BuildConfig`` and the library.

The options are enumerated from :data:`h5forge.options.PACK_OPTIONS`: each must exist on every
surface with the same default, and each value must be accepted by all of them or refused by
all of them with the same message. No Prefect is started: an accepted value is one that gets a
command as far as its source check (the source given here does not exist), which runs after
every option was validated and before any work.
"""

from __future__ import annotations

import inspect
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import typer.main
from pydantic import ValidationError
from typer.testing import CliRunner

from h5forge.cli.options import pack_default
from h5forge.deployments.cli import app
from h5forge.flows.config import BuildConfig
from h5forge.options import (
    CODEC_LEVELS,
    PACK_OPTIONS,
    RENAMED_OPTIONS,
    OptionError,
    format_size,
    option,
)
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig

_COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]
_LIBRARY = (
    {f.name: f.default for f in fields(ImageConfig)}
    | {f.name: f.default for f in fields(PackConfig) if f.name != "image"}
    | {
        name: p.default
        for name, p in inspect.signature(pack).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    }
)


@pytest.mark.parametrize("opt", PACK_OPTIONS, ids=lambda o: o.name)
def test_every_pack_option_exists_everywhere_with_one_default(opt: Any) -> None:
    for command in ("pack", "build"):
        params = {p.name: p for p in _COMMANDS[command].params}
        assert opt.name in params, f"{command} lacks {opt.flag}"
        param = params[opt.name]
        assert opt.flag in param.opts, (command, param.opts)
        assert param.default == pack_default(opt.name), command
        assert opt.help in (param.help or ""), command
    field = BuildConfig.model_fields[opt.name]
    assert field.description == opt.description
    default = opt.default[0] if opt.kind == "size" else opt.default
    assert field.default == default
    assert opt.name in _LIBRARY, f"the library's pack() takes no {opt.name}"
    library = _LIBRARY[opt.name]
    assert library == opt.default or (library is None and opt.default == "none"), opt.name


def _cases(valid: bool) -> list[dict[str, Any]]:
    """Option values (typed as Python gives them) that every surface must accept/refuse."""
    cases: list[dict[str, Any]] = []
    for o in PACK_OPTIONS:
        if o.kind == "choice":
            if valid:
                for c in o.choices:
                    cases.append(
                        {
                            o.name: c,
                            **(
                                {"layout": "encoded"}
                                if o.name == "encoding" and c != "original"
                                else {}
                            ),
                        }
                    )
            else:
                cases.append({o.name: "bogus"})
        elif o.name == "compression_level":
            for codec, (low, high, _) in CODEC_LEVELS.items():
                levels = (low, high) if valid else (low - 1, high + 1)
                cases.extend({"compression": codec, o.name: v} for v in levels)
            if not valid:
                cases.append({"compression": "lzf", o.name: 1})
        elif o.name == "shorter_side":  # must also be >= max(size)
            cases.extend(
                [{o.name: 8, "size": (8, 8)}, {o.name: 4096}]
                if valid
                else [{o.name: 7, "size": (8, 8)}, {o.name: 4097}, {o.name: 100}]
            )
        elif o.kind in ("int", "float"):
            if valid:
                cases.extend({o.name: v} for v in (o.low, o.high, o.default) if v is not None)
            else:
                cases.append({o.name: o.low - (1 if o.kind == "int" else 0.5)})
                if o.high is not None:
                    cases.append({o.name: o.high + (1 if o.kind == "int" else 0.5)})
        elif o.kind == "size":
            cases.extend(
                [
                    {"size": (8, 8)},
                    {"size": (4096, 4096)},
                    {"size": (8, 4096)},
                    {"size": None, "resize": "none"},
                ]
                if valid
                else [{"size": (7, 7)}, {"size": (8, 4097)}, {"size": (0, 10)}]
            )
        elif o.kind == "columns":
            cases.extend(
                [{"listing": "labels.jsonl", o.name: "tags=multilabel,caption=text"}]
                if valid
                else [{o.name: "tags=video"}, {o.name: "x"}, {o.name: "caption=text"}]
            )
        elif not valid and o.name == "coco":  # one source layout at a time
            cases += [{"listing": "a.csv", "coco": "b.json"}, {"coco": "b.json", "masks": "m"}]
        elif o.name == "coco_masks":  # with a COCO file only
            cases.append({"coco": "b.json", o.name: True} if valid else {o.name: True})
        elif valid and o.kind == "bool":
            cases.append({o.name: True})
        elif valid and o.kind == "path":
            cases.append({o.name: "labels.csv"})
    return cases


def _args(case: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, value in case.items():
        o = option(name)
        if o.kind == "bool":
            out.append(o.flag if value else f"--no-{o.flag[2:]}")
        elif o.kind == "size":
            h, w = value or (None, None)
            out += [o.flag, "none" if value is None else (f"{h}" if h == w else f"{h}x{w}")]
        else:
            out += [o.flag, str(value)]
    return out


def _fields(case: dict[str, Any]) -> dict[str, Any]:
    out = dict(case)
    if "size" in out:
        hw = out.pop("size")
        if hw is not None:
            out.update(size=hw[0], width=hw[1] if hw[1] != hw[0] else None)
    return out


def _line(command: str, tmp_path: Path, args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, [command, str(tmp_path / "no-such-source"), str(tmp_path / "out.h5"), *args]
    )
    assert "Traceback" not in result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
    assert errors, result.output
    return result.exit_code, errors[0]


def _id(case: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items())


@pytest.mark.parametrize("case", _cases(valid=True), ids=_id)
def test_each_value_accepted_by_one_surface_is_accepted_by_all(
    case: dict[str, Any], tmp_path: Path
) -> None:
    for command in ("pack", "build"):
        code, line = _line(command, tmp_path, _args(case))
        # Every option passed; the first thing refused is the missing source.
        assert (code, line.split(" does not exist")[0]) == (
            2,
            f"error: source {tmp_path / 'no-such-source'}",
        ), (command, line)
    config = BuildConfig(source="/data", destination="/out/x.h5", **_fields(case))
    image = config.pack_config().image
    for name, value in case.items():
        if name in {f.name for f in fields(ImageConfig)}:
            assert getattr(image, name) == value, name  # pack_config() keeps every option


@pytest.mark.parametrize("case", _cases(valid=False), ids=_id)
def test_each_value_refused_by_one_surface_is_refused_by_all_with_one_message(
    case: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(ValidationError) as refused:
        BuildConfig(source="/data", destination="/out/x.h5", **_fields(case))
    errors = refused.value.errors()
    assert len(errors) == 1, errors
    cause = errors[0]["ctx"]["error"]
    if isinstance(cause, OptionError):
        expected = f"error: invalid value for {option(cause.option).flag}: {cause}"
    else:  # a rule across options (shorter_side >= max(size))
        expected = f"error: {cause}"
    if isinstance(cause, OptionError):
        value = case[cause.option]
        shown = format_size(value) if cause.option == "size" else str(value)
        assert shown in str(cause), (shown, str(cause))  # the message names the value found
    for command in ("pack", "build"):
        assert _line(command, tmp_path, _args(case)) == (2, expected), command


@pytest.mark.parametrize("text", ["abc", "224x", "x224", "224x256x3", "-8", "1e3", ""])
def test_the_size_grammar_is_one_for_pack_and_build(text: str, tmp_path: Path) -> None:
    pack_line = _line("pack", tmp_path, ["--size", text])
    assert pack_line == _line("build", tmp_path, ["--size", text])
    assert pack_line[0] == 2
    assert "is not S, HxW or none" in pack_line[1]


def test_size_none_needs_resize_none_in_pack_and_build(tmp_path: Path) -> None:
    line = _line("pack", tmp_path, ["--size", "none"])
    assert line == _line("build", tmp_path, ["--size", "none"])
    assert line[1].startswith("error: invalid value for --size: size=None needs resize='none'")
    accepted = _line("build", tmp_path, ["--size", "none", "--resize", "none"])
    assert "does not exist" in accepted[1]


def test_codec_levels_are_refused_at_config_time_not_after_fetch() -> None:
    # Today's gap: zstd level 0 passed BuildConfig and failed in the writer, after the fetch.
    with pytest.raises(ValidationError, match=r"compression_level=0 is out of range for zstd"):
        BuildConfig(source="/d", destination="/o.h5", compression="zstd", compression_level=0)
    with pytest.raises(OptionError, match=r"compression_level=0 is out of range for zstd"):
        pack(
            "/does/not/matter",
            "/tmp/never.h5",
            config=PackConfig(compression="zstd", compression_level=0),
        )


def test_the_form_keeps_bounds_in_its_schema() -> None:
    # The UI form and the server (enforce_parameter_schema) refuse out-of-range numbers too.
    props = BuildConfig.model_json_schema()["properties"]
    for o in PACK_OPTIONS:
        if o.kind not in ("int", "float") or o.low is None:
            continue
        prop = props[o.name]
        number = next(b for b in prop.get("anyOf", [prop]) if b.get("type") != "null")
        assert number["minimum"] == o.low, o.name
        assert number.get("maximum") == o.high, o.name
    assert (props["size"]["minimum"], props["size"]["maximum"]) == (8, 4096)


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_OPTIONS.items()))
def test_an_old_option_name_fails_naming_the_new_one_everywhere(
    old: str, new: str, tmp_path: Path
) -> None:
    # A saved deployment's parameters, a prefect.yaml or a dict: never a silent new meaning.
    with pytest.raises(ValidationError) as refused:
        BuildConfig.model_validate({"source": "/data", "destination": "/out/x.h5", old: "7"})
    assert f"{old} was renamed {new}" in str(refused.value)
    assert new in BuildConfig.model_fields
    old_flag, new_flag = (f"--{n.replace('_', '-')}" for n in (old, new))
    for command in ("pack", "build"):
        params = {p.name for p in _COMMANDS[command].params}
        if new not in params:
            continue  # pack has no Dask parts
        shown = {o for p in _COMMANDS[command].params if not p.hidden for o in p.opts}
        assert (new_flag in shown, old_flag in shown) == (True, False), command  # --help: new
        # Refused while parsing, before the source check and before Prefect is imported.
        assert _line(command, tmp_path, [old_flag, "7"]) == (
            2,
            f"error: {old_flag} was renamed {new_flag} (same meaning, same values); "
            f"give {new_flag} instead",
        ), command

"""The console script explains itself: every parameter of every command has a help text, and
every option with a default shows it; ``h5forge --version`` answers without Prefect.

The commands are walked from the click tree Typer builds (``typer.main.get_command``), so a
command or option added later is held to the same rule without touching this file.
"""

from __future__ import annotations

import enum
import re
import subprocess
import sys
from typing import Any

import pytest
import typer.main
from typer.core import TyperOption
from typer.testing import CliRunner

import h5forge
from h5forge.deployments.cli import app

_ROOT = typer.main.get_command(app)


def _walk(group: Any, path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every command under ``group`` by its words (``build``, ``server start``), groups too."""
    found = {}
    for name, command in getattr(group, "commands", {}).items():
        found[" ".join((*path, name))] = command
        found |= _walk(command, (*path, name))
    return found


_COMMANDS: dict[str, Any] = _walk(_ROOT)


def _help(args: list[str]) -> tuple[str, dict[str, str]]:
    """``--help`` as a person reads it: the whole text on one line (box drawing and line
    breaks removed), and each option's row by its first flag."""
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    rows: dict[str, str] = {}
    flag = None
    for line in result.output.splitlines():
        body = re.sub(r"[│╭╮╰╯─]", " ", line).strip()
        starts = re.match(r"(--[\w-]+)", body)
        if starts:
            flag = starts.group(1)
            rows[flag] = body
        elif flag and body:
            rows[flag] += " " + body
        if line.lstrip().startswith("╰"):
            flag = None
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split()), rows


def _shown(value: Any) -> str:
    return str(value.value if isinstance(value, enum.Enum) else value)


def test_the_walk_covers_every_command() -> None:
    assert {"build", "demo", "pack", "verify", "inspect", "versions", "diff"} <= set(_COMMANDS)


#: Flags an older h5forge had, now refused naming their new names.
OLD_SPELLINGS = {"--manifest", "--no-manifest", "--shard-size", "--shard-bytes"}


@pytest.mark.parametrize("name", sorted(_COMMANDS))
def test_every_parameter_says_what_it_does_and_its_default(name: str) -> None:
    command = _COMMANDS[name]
    text, rows = _help(name.split())
    params = [p for p in command.params if p.name != "help"]
    # Hidden: only the old spellings of renamed options, which exist to refuse naming the new
    # one (tests/flows/test_vocabulary.py); no user reads them in --help.
    hidden = [p for p in params if getattr(p, "hidden", False)]
    assert {p.opts[0] for p in hidden} <= OLD_SPELLINGS, [p.opts for p in hidden]
    for p in [p for p in params if p not in hidden]:
        about = f"{name} {'/'.join(p.opts)}"
        helptext = " ".join((getattr(p, "help", None) or "").split())
        assert len(helptext) >= 12, f"{about} has no help"
        # Whole, as written: nothing eaten as markup (a [word] in brackets), nothing cut.
        shown = " ".join(rows[p.opts[0]].split()) if isinstance(p, TyperOption) else text
        assert helptext in shown, f"{about}: its help is not shown as written"
        if not isinstance(p, TyperOption):
            if p.default is not None:  # an optional argument
                assert f"[default: {_shown(p.default)}]" in text, f"{about}: default not shown"
            continue
        row = " ".join(rows[p.opts[0]].split())
        if p.is_flag:
            continue  # --x/--no-x shows [default: no-x]; --json alone: off unless given
        if p.default is None:
            # No value to show: the help says what happens without the option.
            assert "default" in helptext.lower(), f"{about}: say what the default does"
        else:
            assert f"[default: {_shown(p.default)}]" in row, f"{about}: default not shown"


def test_every_command_has_a_summary() -> None:
    for name, command in _COMMANDS.items():
        assert len((command.help or "").split()) >= 5, name


def test_version_prints_the_programs_version_without_prefect() -> None:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "h5forge.deployments.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == f"h5forge {h5forge.__version__}\n"
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in run.stderr.splitlines()]
    assert "h5forge" in imported
    assert not [m for m in imported if m.split(".")[0] in ("prefect", "pydantic", "torch")]


def test_the_programs_version_is_not_an_assets_version() -> None:
    # `h5forge --version` is the program's; `h5forge verify --version` picks an asset's.
    root = {o for p in _ROOT.params for o in p.opts}
    assert "--version" in root
    for name in ("verify", "inspect"):
        [param] = [p for p in _COMMANDS[name].params if "--version" in p.opts]
        assert param.name == "version"
        assert not getattr(param, "is_flag", False), name

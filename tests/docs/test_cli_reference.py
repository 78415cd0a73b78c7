"""The site's command-line reference (docs/hooks/cli_reference.py) covers every command."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "cli_reference.py"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", HOOK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_of_the_console_script_has_a_section() -> None:
    from h5forge.deployments.cli import app

    page = _hook().cli_reference()
    root = typer.main.get_command(app)
    names = root.list_commands(root.context_class(root, info_name="h5forge"))  # type: ignore[attr-defined]
    assert len(names) >= 7
    for name in names:
        assert f"`h5forge {name}`" in page, f"no section for h5forge {name}"


def test_groups_options_and_markup_are_rendered() -> None:
    """A sub-app (as ``server start|status|stop``), a root option, help that looks like markup."""
    app = typer.Typer()
    server = typer.Typer(help="Run one local server.")

    @app.callback()
    def main(
        version: Annotated[bool, typer.Option("--version", help="print the version")] = False,
    ) -> None:
        """Top help."""

    @app.command()
    def pack(
        src: Annotated[str, typer.Argument(help="a <FOLDER> [in 1..2] [default: x]")],
        size: Annotated[int, typer.Option(help="S|HxW")] = 224,
    ) -> None:
        """Pack it."""

    @server.command()
    def start() -> None:
        """Start it."""

    app.add_typer(server, name="server")
    hook = _hook()
    root = typer.main.get_command(app)
    page = "\n".join(
        hook.command_sections(root, root.context_class(root, info_name="h5forge"), level=2)
    )
    assert "`h5forge server start`" in page
    assert "| `--version` | print the version |" in page
    assert "a &lt;FOLDER&gt; \\[in 1..2\\] \\[default: x\\]" in page
    assert "| `--size <int>` | S\\|HxW \\[default: 224\\] |" in page
    assert "Usage: h5forge pack [OPTIONS] SRC" in page


def test_pages_without_the_marker_pass_through() -> None:
    assert (
        _hook().on_page_markdown("# A page\n", page=None, config=None, files=None) == "# A page\n"
    )

"""The console script's app: the library's commands plus ``build``, ``demo`` and ``server``, on
an app of its own, so that ``h5forge.cli.app`` stays the Prefect-free library CLI."""

from __future__ import annotations

import typer

from h5forge.cli.app import app as library_app
from h5forge.deployments.cli import app


def _names(cli: typer.Typer) -> set[str]:
    return set(typer.main.get_command(cli).commands)  # type: ignore[attr-defined]


def test_the_console_script_has_the_library_commands_and_build_demo_and_server() -> None:
    assert _names(app) == _names(library_app) | {"build", "demo", "server"}


def test_loading_the_console_script_leaves_the_library_app_alone() -> None:
    assert app is not library_app
    assert {"build", "demo", "server"}.isdisjoint(_names(library_app))

"""Linux-only system calls: a platform without one gets a clear error before any work."""

from __future__ import annotations

import ast
import os
import sys
import types
from pathlib import Path

import pytest

from h5forge.errors import H5ForgeError, UnsupportedPlatformError
from h5forge.platforms import require_calls

ROOT = Path(__file__).resolve().parents[2] / "h5forge"
# The calls h5forge's fast paths make that some platforms lack, as require_calls spells them.
LINUX_ONLY = {"memfd_create": "memfd_create", "preadv": "preadv", "flock": "fcntl.flock"}


def test_a_missing_call_names_itself_the_platform_and_what_is_supported() -> None:
    without = types.SimpleNamespace(preadv=os.preadv)  # an os without memfd_create
    with pytest.raises(UnsupportedPlatformError) as caught:
        require_calls("loader()'s batch slots", "preadv", "memfd_create", os_module=without)
    message = str(caught.value)
    assert "loader()'s batch slots needs os.memfd_create" in message
    assert "os.preadv" not in message
    assert repr(sys.platform) in message
    assert "linux" in message
    assert isinstance(caught.value, H5ForgeError | NotImplementedError)


@pytest.mark.skipif(sys.platform != "linux", reason="the calls exist on Linux")
def test_every_linux_only_call_exists_here() -> None:
    require_calls("everything", *LINUX_ONLY.values())


def _calls(tree: ast.AST) -> set[str]:
    return {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }


def _checked(tree: ast.AST) -> set[str]:
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require_calls"
        for arg in node.args[1:]
        if isinstance(arg, ast.Constant)
    }


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: p.name)
def test_a_module_making_a_linux_only_call_checks_for_it_first(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    made = {LINUX_ONLY[c] for c in _calls(tree) if c in LINUX_ONLY}
    assert made <= _checked(tree), f"{path.name} calls {sorted(made - _checked(tree))} unchecked"

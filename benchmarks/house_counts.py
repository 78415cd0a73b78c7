"""Counts of the house's seams (issue 27): run from the repository root, prints one table.

    python benchmarks/house_counts.py [-v]

Counted from the code's own syntax trees (``ast``) over h5forge/, tasks/, flows/, deployments/
(the links under h5forge/ are not counted twice):
- functions with a ``storage_options`` parameter;
- call sites of ``url_to_fs`` and of ``redact_url``/``canonical_url``;
- local-vs-remote decisions: ``isinstance(..., LocalFileSystem)``, calls of ``is_local``-like
  helpers, and string tests of a URL's scheme (``"://" in``, ``.startswith("file...")``);
- modules by size (lines), and modules imported by exactly one other module (``-v`` lists them).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOTS = ("h5forge", "tasks", "flows", "deployments")
LINKS = ("h5forge/flows/", "h5forge/tasks/", "h5forge/deployments/")
LOCAL_HELPERS = {"is_local", "is_local_url", "_is_local", "is_remote"}


def modules(root: Path) -> dict[str, Path]:
    """Every module by its canonical name (``h5forge.flows.build`` for ``flows/build.py``)."""
    found: dict[str, Path] = {}
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(LINKS):
                continue
            parts = rel.removesuffix(".py").split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts if top == "h5forge" else ["h5forge", *parts])] = path
    return found


def _called(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _kind(node: ast.AST) -> str | None:
    """Which counted thing ``node`` is, if any."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        a = node.args
        if any(x.arg == "storage_options" for x in a.posonlyargs + a.args + a.kwonlyargs):
            return "functions taking storage_options"
        return None
    if isinstance(node, ast.Compare):
        left = node.left
        return (
            "local/remote decisions"
            if isinstance(left, ast.Constant) and left.value == "://"
            else None
        )
    if not isinstance(node, ast.Call):
        return None
    called = _called(node)
    if called == "url_to_fs":
        return "url_to_fs call sites"
    if called in ("redact_url", "canonical_url"):
        return "redact_url/canonical_url call sites"
    first = ast.unparse(node.args[0]) if node.args else ""
    local = (
        (called == "isinstance" and "LocalFileSystem" in ast.unparse(node))
        or called in LOCAL_HELPERS
        or (called == "startswith" and "file" in first)
    )
    return "local/remote decisions" if local else None


def _imported(node: ast.AST, mods: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.ImportFrom) and node.module:
        out = set()
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            if sub in mods:
                out.add(sub)
            elif node.module in mods:
                out.add(node.module)
        return out
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in mods}
    return set()


def main() -> int:
    mods = modules(Path("."))
    counts: dict[str, list[str]] = defaultdict(list)
    importers: dict[str, set[str]] = defaultdict(set)
    sizes = []
    for name, path in mods.items():
        text = path.read_text()
        sizes.append(len(text.splitlines()))
        for node in ast.walk(ast.parse(text)):
            if kind := _kind(node):
                counts[kind].append(name)
            for target in _imported(node, mods) - {name}:
                importers[target].add(name)
    single = sorted(m for m in mods if len(importers[m]) == 1 and not m.endswith("__main__"))
    rows = [("modules", len(mods)), ("lines", sum(sizes))]
    rows += [(k, f"{len(v)} in {len(set(v))} modules") for k, v in sorted(counts.items())]
    rows += [
        ("modules of 280-299 lines", sum(280 <= s <= 299 for s in sizes)),
        ("modules over 300 lines", sum(s > 300 for s in sizes)),
        ("modules over 500 lines", sum(s > 500 for s in sizes)),
        ("single-importer modules", len(single)),
    ]
    for key, value in rows:
        print(f"| {key} | {value} |")
    if "-v" in sys.argv:
        print("single-importer:", " ".join(single))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The house's shape, read from the code's own imports with ``ast``.

* no import circle among the modules of ``h5forge/`` (imports inside functions count too;
  ``if TYPE_CHECKING:`` blocks do not, they never run);
* no module imports an underscore name of another (``from h5forge.x import _y``, ``x._y``):
  what siblings share is public inside the package;
* no environment read outside ``deployments/``;
* imports point down the layers: ``h5forge.deployments`` -> ``h5forge.flows`` ->
  ``h5forge.tasks`` -> the library (the rest of ``h5forge``), and the library imports neither
  Prefect nor anything above it, so ``pip install h5forge`` without extras reads assets;
* inside the library, a package never imports one that builds on it (:data:`BUILDS_ON`):
  ``h5forge.scale`` builds on ``h5forge.pack`` (its commit, config, writer), so nothing of
  ``h5forge.pack`` imports ``h5forge.scale``; what both need (the stored-copy kernel) lives
  in a package neither owns;
* one top-level import name: ``flows/``, ``tasks/`` and ``deployments/`` are reached as
  ``h5forge.flows`` (and so on) through links under ``h5forge/``;
* a library module imported by one module only says why it stands alone (:data:`ALONE`);
* a module past about 500 lines says why it is one idea (:data:`LONG_MODULES`): size is a
  hint to look, not a wall that splits an idea across files;
* the library's tests mirror its packages (``tests/h5forge/<package>/``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("h5forge",)
#: The packages above the library, top first, each in its own folder of the repository.
LAYERS = ("deployments", "flows", "tasks")
#: Library packages that build on others: none of the packages named on the right imports the
#: one on the left.
BUILDS_ON: dict[str, tuple[str, ...]] = {"h5forge.scale": ("h5forge.pack",)}
#: About this many lines is a hint to look at a module; past it, a reason is recorded here.
MAX_LINES = 500
#: Modules longer than ``MAX_LINES``, each with why it is still one idea.
LONG_MODULES: dict[str, str] = {
    "h5forge.location": "the library's one I/O seam: a URL and its options resolved once, "
    "printed redacted, and every way bytes cross it (bounded documents, reads bounded in time "
    "and bytes, downloads, hashes, atomic writes); a second module would be a second door",
    "h5forge.read.fill": "one cache entry while the reader's fetches fill it: its block "
    "records, what is served from it, and its completion (fetch, hash, seal; beside a worker's "
    "batches) or discard, all one state on one folder under one lock",
    "h5forge.asset.coalesce": "one remote reader's plan for a batch: which bytes come from "
    "blocks kept in memory, the local store, another process's fetch (its claim) or the server, "
    "and its fetch ahead, sharing the reader's kept blocks under one process budget",
    "h5forge.read.targets": "the reader's view of target columns, read as one: what target= "
    "selects, how one process reads those columns and checks their values, how they collate",
    "h5forge.options": "every pack option defined once: what an option is and how a value is "
    "checked, the table of options, the rules between them, the renamed names",
    "h5forge.flows.build": "the build flow: its two choices (where it publishes, how it packs) "
    "beside the stages they choose between, a sharded version's included",
    "h5forge.publish.history": "what an asset keeps, read as one: the versions it lists (either "
    "kind), which retention removes, and the shards they keep (garbage collection reads the same "
    "listing, and its safety argument spans retention and the listing: docs/versions.md)",
}


def _modules() -> dict[str, Path]:
    """Every module by its one import name (``flows/build.py`` is ``h5forge.flows.build``)."""
    found = {}
    for folder, prefix in [("h5forge", ()), *((layer, ("h5forge",)) for layer in LAYERS)]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = (*prefix, *path.relative_to(ROOT).with_suffix("").parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (``if TYPE_CHECKING:`` bodies left out)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    base = package if is_package else package[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str | None]]:
    """``(module imported, name taken from it or None)`` for each name of one import."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name, None
        return
    source = _absolute(module, node)
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        if submodule in MODULES:
            yield submodule, None
        else:
            yield source, alias.name


def _edges(module: str) -> set[str]:
    out = set()
    for node in _imports(_tree(MODULES[module])):
        for target, _ in _targets(module, node):
            if target in MODULES and target != module:
                out.add(target)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_cycle_finder_finds_a_circle_and_only_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def _layer(module: str) -> int:
    """0 for the library, then 1 tasks, 2 flows, 3 deployments."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return len(LAYERS) - LAYERS.index(parts[1])
    return 0


def test_the_layer_folders_are_linked_into_the_one_import_name() -> None:
    for layer in LAYERS:
        link = ROOT / "h5forge" / layer
        assert link.is_symlink(), f"h5forge/{layer} must link to ../{layer}"
        assert link.resolve() == (ROOT / layer).resolve()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module: str) -> None:
    up = []
    for node in _imports(_tree(MODULES[module])):
        for target, _ in _targets(module, node):
            top = target.split(".")[0]
            if top in LAYERS:
                up.append(f"line {node.lineno}: imports {target} by its pre-0.2 name")
            elif target in MODULES and _layer(target) > _layer(module):
                up.append(f"line {node.lineno}: imports {target}, a layer above it")
            elif top == "prefect" and _layer(module) == 0:
                up.append(f"line {node.lineno}: the library imports Prefect")
    assert not up, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(up)


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _imports_of_what_builds_on_it(module: str, tree: ast.Module) -> list[str]:
    """The imports in ``tree`` (the code of ``module``) of a package built on ``module``'s."""
    above = {top for top, below in BUILDS_ON.items() if _package(module) in below}
    return [
        f"line {node.lineno}: imports {target}, and {_package(target)} builds on "
        f"{_package(module)}: move what both need below both (e.g. into h5forge.asset)"
        for node in _imports(tree)
        for target, _ in _targets(module, node)
        if _package(target) in above
    ]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m) == 0))
def test_a_package_never_imports_one_that_builds_on_it(module: str) -> None:
    found = _imports_of_what_builds_on_it(module, _tree(MODULES[module]))
    assert not found, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(found)


def test_the_package_rule_sees_pack_importing_scale() -> None:
    """Either spelling, even inside a function; not the other way round."""
    code = "def f():\n    from h5forge.scale.merge import merge_shards\nimport h5forge.scale.plan\n"
    found = _imports_of_what_builds_on_it("h5forge.pack.sink", ast.parse(code))
    assert sorted(line.split(",")[0] for line in found) == [
        "line 2: imports h5forge.scale.merge",
        "line 3: imports h5forge.scale.plan",
    ]
    upward = ast.parse("from h5forge.pack.commit import staged\n")
    assert _imports_of_what_builds_on_it("h5forge.scale.merge", upward) == []


def test_the_layer_finder_sees_an_upward_import() -> None:
    assert (
        _layer("h5forge.deployments.cli")
        > _layer("h5forge.flows.build")
        > _layer("h5forge.tasks.pack")
        > _layer("h5forge.pack.writer")
    )


def test_no_import_circle_in_the_library() -> None:
    library = {m for m in MODULES if _layer(m) == 0}
    graph = {m: _edges(m) & library for m in library}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _underscore_uses(module: str) -> Iterator[str]:
    tree = _tree(MODULES[module])
    aliases: dict[str, str] = {}  # local name -> project module it is bound to
    for node in _imports(tree):
        for (target, name), alias in zip(_targets(module, node), node.names, strict=True):
            if target.split(".")[0] not in PACKAGES:
                continue
            local = alias.asname or alias.name.split(".")[0]
            if name is not None and _private(name):
                yield f"line {node.lineno}: imports {name} from {target}"
            elif any(_private(part) for part in target.split(".")[1:]):
                yield f"line {node.lineno}: imports the private module {target}"
            elif name is None and (alias.asname or isinstance(node, ast.ImportFrom)):
                aliases[local] = target
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
        ):
            yield f"line {node.lineno}: uses {aliases[node.value.id]}.{node.attr}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_underscore_name_crosses_modules(module: str) -> None:
    found = list(_underscore_uses(module))
    assert not found, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(found)


_ENV_READERS = {("os", "environ"), ("os", "getenv"), ("os", "putenv"), ("os", "unsetenv")}


def _environment_reads(path: Path) -> Iterator[str]:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in _ENV_READERS:
                yield f"line {node.lineno}: os.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if ("os", alias.name) in _ENV_READERS:
                    yield f"line {node.lineno}: from os import {alias.name}"


# The few reads outside deployments a library default needs, each with its reason.
ENVIRONMENT_READS: dict[str, str] = {
    "h5forge.read.cache": (
        "XDG_CACHE_HOME: where the default read cache lives (the XDG base-directory rule), "
        "read when a remote dataset is made, as every XDG program does"
    ),
}


@pytest.mark.parametrize(
    "module",
    sorted(
        m for m in MODULES if not m.startswith("h5forge.deployments") and m not in ENVIRONMENT_READS
    ),
)
def test_no_environment_read_outside_deployments(module: str) -> None:
    found = list(_environment_reads(MODULES[module]))
    assert not found, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(found)


@pytest.mark.parametrize("module", sorted(ENVIRONMENT_READS))
def test_a_recorded_environment_read_is_one_variable_and_still_there(module: str) -> None:
    found = list(_environment_reads(MODULES[module]))
    assert len(found) == 1, f"{MODULES[module].relative_to(ROOT)}: " + "; ".join(found)


def test_environment_reads_are_found() -> None:
    found = list(_environment_reads(MODULES["h5forge.deployments.serve"]))
    assert found, "deployments/serve.py reads the environment; the finder must see it"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_long_module_says_why(module: str) -> None:
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines < MAX_LINES or module in LONG_MODULES, (
        f"{MODULES[module].relative_to(ROOT)} has {lines} lines: split it by idea, or record "
        "in LONG_MODULES why it is one"
    )


def test_the_library_tests_mirror_its_packages() -> None:
    """``tests/h5forge/<package>/`` holds the tests of ``h5forge/<package>/``; tests of the
    top-level modules sit in ``tests/h5forge/`` itself."""
    tests = ROOT / "tests" / "h5forge"
    folders = sorted(p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__")
    strays = [f for f in folders if not (ROOT / "h5forge" / f / "__init__.py").is_file()]
    assert not strays, f"tests/h5forge/{strays[0]}/ names no package h5forge/{strays[0]}/"
    packages = {
        p.parent.name for p in (ROOT / "h5forge").glob("*/__init__.py") if not p.parent.is_symlink()
    }
    assert set(folders) <= packages
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    named_for_a_package = [f for f in flat if f.removeprefix("test_").split("_")[0] in packages]
    assert not named_for_a_package, f"move {named_for_a_package} into their package's folder"


def _importers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target in _edges(module):
            found[target].add(module)
    return found


IMPORTERS = _importers()
#: Library modules imported by one module only, each with why it stands on its own (a boundary
#: read on its own, an idea with its own tests, a public name): without a reason, fold it into
#: its importer.
ALONE: dict[str, str] = {
    "h5forge.asset.declared": (
        "declared shapes and counts checked at open: a boundary on untrusted files"
    ),
    "h5forge.cli.summary": (
        "the inspect summary's words, apart from the command wiring in cli.app"
    ),
    "h5forge.cli.verify": (
        "the verify command's report and exit codes, apart from the command wiring"
    ),
    "h5forge.demo": ("public: the built-in demo dataset, used by the CLI, the docs and the tests"),
    "h5forge.discover.coco": ("one listing format (COCO instances): its own bounds and tests"),
    "h5forge.discover.coco_masks": (
        "COCO segmentations drawn into masks: its own format rules and tests"
    ),
    "h5forge.discover.paired": (
        "one source layout (images/ + masks/ by stem): its own rules and tests"
    ),
    "h5forge.discover.report": (
        "a catalog in words for the task's log and report; no discover rule lives there"
    ),
    "h5forge.cli.shards": ("the compact and purge commands, apart from the command wiring"),
    "h5forge.fetch.extract": ("safe archive extraction: a security boundary read on its own"),
    "h5forge.fetch.http": (
        "the download loop (limits, retries, watchdog): a boundary read on its own"
    ),
    "h5forge.fetch.members": (
        "archive member names checked before extraction: a security boundary"
    ),
    "h5forge.fetch.objects": ("object and prefix copies through fsspec, one kind of source"),
    "h5forge.pack.previous": ("the checked index of the version an incremental pack reuses"),
    "h5forge.pack.sink": ("collecting results into /images: the writer's storage half"),
    "h5forge.preprocess.decode": (
        "decode + resize for one image, apart from quarantine and targets"
    ),
    "h5forge.preprocess.jpeg": ("one decoder backend (libjpeg-turbo, DCT scaling)"),
    "h5forge.preprocess.pool": ("the decode pool: processes, ordering, the ring"),
    "h5forge.preprocess.resample": (
        "one resize kernel (torch antialiased), checked against Pillow"
    ),
    "h5forge.preprocess.ring": ("the shared-memory ring results come back in"),
    "h5forge.publish.diff": ("comparing two versions' indexes: its own command and tests"),
    "h5forge.publish.release": (
        "publishing one file as a version: the public call the publish task and scripts make"
    ),
    "h5forge.publish.rewrite": (
        "rewriting published shards (compact, purge): a takedown is read on its own"
    ),
    "h5forge.publish.overlay": (
        "drawing boxes and masks on the preview: image code apart from publishing"
    ),
    "h5forge.read.asset_list": (
        "the asset list: an untrusted document with its own bounds and tests"
    ),
    "h5forge.read.sampler": ("public: the resumable, distributed Sampler"),
    "h5forge.read.shard_check": (
        "what proves a local shard is the file its manifest names, and when a check made "
        "once (before the workers fork) still holds: a trust boundary with its own tests"
    ),
    "h5forge.s3_session": (
        "s3fs and botocore internals in one place: the session a process tree shares"
    ),
    "h5forge.scale.assemble": ("writing the merged file, apart from the merge's checks and plan"),
    "h5forge.scale.download": ("a checked local copy of a remote part"),
    "h5forge.scale.merge": ("public: merge_parts, the Dask stage's merge"),
    "h5forge.smoke.expected": (
        "what each sample must read back as, apart from running the workers"
    ),
    "h5forge.targets.drawn": (
        "drawing polygons and RLE into masks: geometry code with its own tests"
    ),
    "h5forge.targets.stats": ("the build report's target figures"),
    "h5forge.verify.layout": ("byte ranges against the chunk index: one check of verify"),
    "h5forge.verify.metadata": ("the metadata digest check: one check of verify"),
    "h5forge.verify.targets": (
        "every target column's digests and value rules: one check of verify"
    ),
}


def _alone() -> list[str]:
    return sorted(
        m
        for m in MODULES
        if _layer(m) == 0 and MODULES[m].name != "__init__.py" and len(IMPORTERS[m]) == 1
    )


@pytest.mark.parametrize("module", _alone())
def test_a_module_with_one_importer_says_why(module: str) -> None:
    (importer,) = IMPORTERS[module]
    assert module in ALONE, (
        f"{MODULES[module].relative_to(ROOT)} is imported only by {importer}: fold it into "
        "that module, or record in ALONE why it is an idea of its own"
    )


def test_every_recorded_reason_is_still_needed() -> None:
    stale = sorted(set(ALONE) - set(_alone()))
    assert not stale, f"{stale} no longer have a single importer: remove them from ALONE"

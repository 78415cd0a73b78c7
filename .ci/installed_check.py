"""Checks an installed h5forge wheel from outside the checkout (run by ``.ci/check-dist``).

``python installed_check.py reader`` in a venv holding the core install (``pip install
h5forge``), ``... all`` in one holding ``h5forge[all]``. It checks that the distribution adds
only the ``h5forge`` import name (and its console script), that every public name of every
module imports (in the core install: every module but the pipeline's, which must refuse with
the ``pip install`` line), and that the console script and a pack, verify and loader() read
work from there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import subprocess
import sys
import tempfile
from pathlib import Path

PIPELINE = ("h5forge.flows", "h5forge.tasks", "h5forge.deployments")
# Modules that need an extra beyond the core install, and the extra.
NEEDS_EXTRA = {"h5forge.flows": "pipeline", "h5forge.tasks": "pipeline"}


def check_layout() -> None:
    import h5forge

    checkout = Path(__file__).resolve().parents[1]
    here = Path(h5forge.__file__).resolve()
    assert checkout not in here.parents, f"h5forge imported from the checkout: {here}"
    dist = importlib.metadata.distribution("h5forge")
    assert dist.version == h5forge.__version__, (dist.version, h5forge.__version__)
    tops = {Path(str(f)).parts[0] for f in dist.files or []}
    tops = {t for t in tops if not t.endswith(".dist-info") and t != ".."}
    assert tops == {"h5forge"}, f"the wheel installs other top-level names: {sorted(tops)}"
    print(f"layout: only 'h5forge' in site-packages, version {dist.version}")


def check_imports(kind: str) -> None:
    import h5forge

    for name in h5forge.__all__:
        getattr(h5forge, name)
    modules = [
        m.name
        for m in pkgutil.walk_packages(h5forge.__path__, "h5forge.")
        if not m.name.endswith(".__main__")  # runs the CLI when imported
    ]
    assert any(m.startswith("h5forge.flows.") for m in modules) or kind == "reader", modules
    refused, imported = [], 0
    for name in sorted(modules):
        pipeline = name.startswith(PIPELINE)
        try:
            module = importlib.import_module(name)
        except h5forge.MissingExtraError as e:
            assert kind == "reader" and pipeline, f"{name}: {e}"
            assert "pip install 'h5forge[pipeline]'" in str(e), str(e)
            refused.append(name)
            continue
        except ImportError as e:
            if kind == "reader" and pipeline:  # below a refusing package: never imported
                refused.append(name)
                continue
            raise AssertionError(f"{name} does not import in the {kind} install: {e}") from e
        for public in getattr(module, "__all__", ()):
            getattr(module, public)
        imported += 1
    if kind == "reader":
        assert "h5forge.flows" in refused and "h5forge.tasks" in refused, refused
        try:
            import prefect  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("the core install pulled in Prefect")
    print(f"imports: {imported} modules and their public names; {len(refused)} refused")


def run(*args: str, expect: int = 0) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == expect, f"{args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def check_cli_and_read(kind: str) -> None:
    from h5forge import H5ImageDataset
    from h5forge.demo import write_image_folder

    h5forge_cli = str(Path(sys.executable).with_name("h5forge"))
    version = run(h5forge_cli, "--version")
    assert importlib.metadata.version("h5forge") in version, version
    run(h5forge_cli, "--help")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "images"
        write_image_folder(folder, classes=("cat", "dog"), per_class=8, seed=0)
        out = Path(tmp) / "out.h5"
        run(h5forge_cli, "pack", str(folder), str(out), "--size", "32", "--workers", "1")
        run(h5forge_cli, "verify", str(out))
        built = run(h5forge_cli, "build", str(folder), str(Path(tmp) / "b.h5"), "--help")
        assert "Usage" in built, built
        if kind == "reader":
            said = run(h5forge_cli, "build", str(folder), str(Path(tmp) / "b.h5"), expect=2)
            assert "pip install 'h5forge[pipeline]'" in said, said
        ds = H5ImageDataset(str(out))
        images, labels = next(iter(ds.loader(4, num_workers=1)))
        assert tuple(images.shape) == (4, 3, 32, 32), images.shape
        assert len(labels) == 4
    print(f"cli: --version, --help, pack, verify, build ({kind}); loader() read a batch")


def main() -> None:
    kind = sys.argv[1]
    assert kind in ("reader", "all"), kind
    check_layout()
    check_imports(kind)
    check_cli_and_read(kind)
    print(f"installed check ({kind}): passed")


if __name__ == "__main__":
    main()

"""Optional dependencies: which extra brings each one, and the error that says how to get it.

The core install (``pip install h5forge``) is the reader and the library's command line:
numpy, h5py, Pillow, fsspec, torch, typer and rich. Everything else is an extra, named in
``pyproject.toml``; a feature that needs one checks for it before any work and raises
:class:`~h5forge.errors.MissingExtraError` with the ``pip install`` line that fixes it.
"""

from __future__ import annotations

import importlib.util

from h5forge.errors import MissingExtraError

__all__ = ["EXTRAS", "require"]

#: The import name of each optional dependency and the extra that installs it.
EXTRAS = {
    "prefect": "pipeline",
    "pydantic": "pipeline",
    "s3fs": "s3",
    "aiohttp": "http",
    "distributed": "dask",
    "prefect_dask": "dask",
    "hdf5plugin": "plugins",
    "torchvision": "vision",
}


def require(module: str, *, feature: str) -> None:
    """Raise :class:`MissingExtraError` unless ``module`` can be imported.

    Args:
        module: an import name listed in :data:`EXTRAS`.
        feature: what needs it, for the message ("h5forge build", "s3:// URLs").

    Raises:
        MissingExtraError: naming the extra and the ``pip install`` line.
    """
    if importlib.util.find_spec(module) is None:
        extra = EXTRAS[module]
        raise MissingExtraError(
            f"{feature} needs {module}, which is not installed: "
            f"pip install 'h5forge[{extra}]' (or 'h5forge[all]' for every extra)"
        )

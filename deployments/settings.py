"""The environment's say in where h5forge's entry points keep their files.

Read by the console script (:mod:`h5forge.deployments.cli`) and the served deployments
(:mod:`h5forge.deployments.serve`) when they run, never at import; the flows take the result as a
parameter (``build_dataset(config, cache_dir=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["CACHE_HOME", "cache_dir_from_env"]

# XDG's base directory for user caches; h5forge keeps its fetch cache in ``h5forge`` below it.
CACHE_HOME = "XDG_CACHE_HOME"


def cache_dir_from_env(environ: Mapping[str, str]) -> Path | None:
    """``$XDG_CACHE_HOME/h5forge``, or None when the variable is unset or empty (the flow then
    uses its default, ``~/.cache/h5forge``: XDG's own default cache home)."""
    base = environ.get(CACHE_HOME)
    return Path(base) / "h5forge" if base else None

"""Prefect tasks: one thin module per pipeline stage over the :mod:`h5forge` library.

Tasks add retries, caching, run names and artifacts; the work itself is done by plain library
functions, which tests call directly. Tasks return the library's own result types
(:class:`~h5forge.fetch.sources.FetchResult`, :class:`~h5forge.discover.catalog.Catalog`,
:class:`~h5forge.pack.writer.PackResult`, :class:`~h5forge.verify.checks.VerifyReport`,
:class:`~h5forge.smoke.SmokeReport`, :class:`~h5forge.publish.storage.PublishResult`) and
exchange paths, never arrays.

The names below load on first use: DataLoader workers started with ``spawn`` import
``tasks.fork`` and must not pay for importing Prefect and every stage.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "discover_samples": "tasks.discover",
    "fetch_source": "tasks.fetch",
    "fetch_task": "tasks.fetch",
    "source_dir": "tasks.fetch",
    "pack_images": "tasks.pack",
    "asset_key": "tasks.publish",
    "make_preview": "tasks.publish",
    "publish_task": "tasks.publish",
    "render_report": "tasks.report",
    "write_report": "tasks.report",
    "smoke_load_file": "tasks.smoke_load",
    "check_manifest": "tasks.verify",
    "load_manifest": "tasks.verify",
    "verify_file": "tasks.verify",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")

"""Prefect tasks: one thin module per pipeline stage over the :mod:`h5forge` library.

Tasks add retries, caching, run names and artifacts; the work itself is done by plain library
functions, which tests call directly. Tasks return the library's own result types
(:class:`~h5forge.fetch.sources.FetchResult`, :class:`~h5forge.discover.catalog.Catalog`,
:class:`~h5forge.pack.writer.PackResult`, :class:`~h5forge.verify.checks.VerifyReport`,
:class:`~h5forge.smoke.SmokeReport`, :class:`~h5forge.publish.storage.PublishResult`) and
exchange paths, never arrays.

The names below load on first use: DataLoader workers started with ``spawn`` import
``h5forge.tasks.fork`` and must not pay for importing Prefect and every stage.
"""

from __future__ import annotations

import importlib
from typing import Any

from h5forge.extras import require
from h5forge.layers import check_import_name

check_import_name(__name__, "tasks", "from h5forge.tasks.pack import pack_images")

require("prefect", feature="h5forge.tasks")

_LAZY = {
    "discover_samples": "h5forge.tasks.discover",
    "fetch_source": "h5forge.tasks.fetch",
    "fetch_task": "h5forge.tasks.fetch",
    "source_dir": "h5forge.tasks.fetch",
    "pack_images": "h5forge.tasks.pack",
    "asset_key": "h5forge.tasks.publish",
    "make_preview": "h5forge.tasks.publish",
    "publish_task": "h5forge.tasks.publish",
    "render_report": "h5forge.tasks.report",
    "write_report": "h5forge.tasks.report",
    "smoke_load_file": "h5forge.tasks.smoke_load",
    "check_sidecar": "h5forge.tasks.verify",
    "load_sidecar": "h5forge.tasks.verify",
    "verify_file": "h5forge.tasks.verify",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")

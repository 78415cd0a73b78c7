"""Prefect tasks: one thin module per pipeline stage over the :mod:`h5forge` library.

Tasks add retries, caching, run names and artifacts; the work itself is done by plain library
functions, which tests call directly. Tasks exchange paths and small pydantic models, never
arrays.

The names below load on first use: DataLoader workers started with ``spawn`` import
``tasks.fork`` and must not pay for importing Prefect and every stage.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CatalogSummary": "tasks.discover",
    "discover_samples": "tasks.discover",
    "FetchedSource": "tasks.fetch",
    "fetch_source": "tasks.fetch",
    "fetch_task": "tasks.fetch",
    "source_dir": "tasks.fetch",
    "PackSummary": "tasks.pack",
    "pack_images": "tasks.pack",
    "PublishSummary": "tasks.publish",
    "asset_key": "tasks.publish",
    "make_preview": "tasks.publish",
    "preview_url": "tasks.publish",
    "publish_task": "tasks.publish",
    "render_report": "tasks.report",
    "write_report": "tasks.report",
    "SmokeSummary": "tasks.smoke_load",
    "smoke_load_file": "tasks.smoke_load",
    "VerifySummary": "tasks.verify",
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

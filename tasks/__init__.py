"""Prefect tasks: one thin module per pipeline stage over the :mod:`h5forge` library.

Tasks add retries, caching, run names and artifacts; the work itself is done by plain library
functions, which tests call directly. Tasks return the library's own result types
(:class:`~h5forge.fetch.sources.FetchResult`, :class:`~h5forge.discover.catalog.Catalog`,
:class:`~h5forge.pack.writer.PackResult`, :class:`~h5forge.verify.checks.VerifyReport`,
:class:`~h5forge.smoke.SmokeReport`, :class:`~h5forge.publish.storage.PublishResult`) and
exchange paths, never arrays.

Import each task from its own module (``from h5forge.tasks.pack import pack_images``); this
package holds nothing else, so DataLoader workers started with ``spawn`` that import
``h5forge.tasks.fork`` do not pay for importing every stage.
"""

from __future__ import annotations

from h5forge.extras import require
from h5forge.layers import check_import_name

check_import_name(__name__, "tasks", "from h5forge.tasks.pack import pack_images")

require("prefect", feature="h5forge.tasks")

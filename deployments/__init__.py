"""Prefect deployments of h5forge's flows: ``prefect.yaml`` for ``prefect deploy`` and a process
work pool, and ``serve.py`` (``python -m h5forge.deployments.serve``) to serve them all from
one process.

This package is the one place in h5forge that reads environment variables, but for
``XDG_CACHE_HOME`` (the default read cache's folder, :func:`h5forge.read.cache.default_cache_dir`).
"""

from h5forge.layers import check_import_name

check_import_name(__name__, "deployments", "python -m h5forge.deployments.serve")

"""Prefect deployments of h5forge's flows: ``prefect.yaml`` for ``prefect deploy`` and a process
work pool, and ``serve.py`` (``python -m h5forge.deployments.serve``) to serve them all from
one process.

This package is the one place in h5forge that reads environment variables.
"""

if __name__ != "h5forge.deployments":  # a checkout's top-level folder, imported by its pre-0.2 name
    raise ImportError(
        f"h5forge's deployments are imported as h5forge.deployments since h5forge 0.2.0, "
        f"not as {__name__} (e.g. `python -m h5forge.deployments.serve`): a top-level"
        " `deployments` package shadowed users' own"
    )

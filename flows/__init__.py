"""Prefect flows that compose the stage tasks: ``build-h5-dataset`` and ``verify-h5-asset``.

Import the flows from their modules (``h5forge.flows.build:build_dataset``,
``h5forge.flows.verify:verify_asset``). They read no environment: the ``h5forge`` console script and
the served deployments (``deployments/``) pass what the environment says as parameters.
"""

if __name__ != "h5forge.flows":  # a checkout's top-level folder, imported by its pre-0.2 name
    raise ImportError(
        f"h5forge's flows are imported as h5forge.flows since h5forge 0.2.0, "
        f"not as {__name__} (e.g. `from h5forge.flows.build import build_dataset`): a top-level"
        " `flows` package shadowed users' own"
    )

from h5forge.extras import require  # noqa: E402 - after the name check above

require("prefect", feature="h5forge.flows")

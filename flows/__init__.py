"""Prefect flows that compose the stage tasks: ``build-h5-dataset`` and ``verify-h5-asset``.

Import the flows from their modules (``h5forge.flows.build:build_dataset``,
``h5forge.flows.verify:verify_asset``). They read no environment: the ``h5forge`` console script and
the served deployments (``deployments/``) pass what the environment says as parameters.
"""

from h5forge.extras import require
from h5forge.layers import check_import_name

check_import_name(__name__, "flows", "from h5forge.flows.build import build_dataset")

require("prefect", feature="h5forge.flows")

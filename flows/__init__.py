"""Prefect flows that compose the stage tasks: ``build-h5-dataset`` and ``verify-h5-asset``.

Import the flows from their modules (``flows.build:build_dataset``,
``flows.verify:verify_asset``). They read no environment: the ``h5forge`` console script and
the served deployments (``deployments/``) pass what the environment says as parameters.
"""

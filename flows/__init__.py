"""Prefect flows that compose the stage tasks: ``build-h5-dataset`` and ``verify-h5-asset``.

Import the flows from their modules (``flows.build:build_dataset``,
``flows.verify:verify_asset``); ``flows.cli:main`` is the ``h5forge`` console script.
"""

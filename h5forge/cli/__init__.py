"""The library's command line: ``h5forge pack``, ``verify`` and ``inspect``, without Prefect.

``app`` (the Typer app and its commands), ``exits`` (exit codes and the error-to-exit table),
``options`` (the pack options' Typer wiring, shared with ``build``), ``summary`` (what
``inspect`` prints). The console script, with ``build`` and ``demo``, is
:mod:`h5forge.deployments.cli`. Nothing is imported here, so that ``--help`` starts fast.
"""

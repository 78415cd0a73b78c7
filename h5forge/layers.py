"""The pipeline's packages above the library, and the one name each is imported by.

The repository keeps ``flows/``, ``tasks/`` and ``deployments/`` at its top level; they install
and import as ``h5forge.flows``, ``h5forge.tasks`` and ``h5forge.deployments`` (links under
``h5forge/``). Imported from a checkout by their pre-0.2 top-level names they would be second
copies of every flow and task, so each package calls :func:`check_import_name` first.
"""

from __future__ import annotations

__all__ = ["check_import_name"]


def check_import_name(name: str, package: str, example: str) -> None:
    """Raise ``ImportError`` unless ``name`` (a package's ``__name__``) is ``h5forge.<package>``.

    Args:
        name: the importing package's ``__name__``.
        package: ``flows``, ``tasks`` or ``deployments``.
        example: an import or command in the new spelling, for the message.
    """
    if name != f"h5forge.{package}":
        raise ImportError(
            f"h5forge's {package} are imported as h5forge.{package} since h5forge 0.2.0, not "
            f"as {name} (e.g. `{example}`): a top-level `{package}` package shadowed users' own"
        )

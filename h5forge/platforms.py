"""Where h5forge runs: Linux today, and a clear error where a Linux-only call is missing.

The fast paths use system calls that only some platforms have: ``os.memfd_create`` for the
loader's reusable batch slots (Linux), ``os.preadv`` for batched local reads (Linux, macOS 11+,
the BSDs) and ``fcntl.flock`` for the locks that keep two writers apart (POSIX). Where one is
missing, the feature that needs it stops before any work with
:class:`~h5forge.errors.UnsupportedPlatformError`, never with an ``AttributeError`` halfway
through, and never by silently skipping a lock.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from h5forge.errors import UnsupportedPlatformError

__all__ = ["SUPPORTED", "require_calls"]

#: The platforms h5forge is built and tested on.
SUPPORTED = ("linux",)


def require_calls(feature: str, *calls: str, os_module: ModuleType = os) -> None:
    """Raise unless every named call exists here.

    Args:
        feature: what needs them, for the message ("loader() batch slots").
        calls: ``os`` function names (``"memfd_create"``), or ``"fcntl.flock"``.
        os_module: the module the ``os`` names are looked up in (``os``).

    Raises:
        UnsupportedPlatformError: naming the missing calls, this platform and the supported ones.
    """
    missing = []
    for call in calls:
        if call == "fcntl.flock":
            if importlib.util.find_spec("fcntl") is None:
                missing.append(call)
        elif not hasattr(os_module, call):
            missing.append(f"os.{call}")
    if missing:
        raise UnsupportedPlatformError(
            f"{feature} needs {', '.join(missing)}, which Python on {sys.platform!r} does not "
            f"have; h5forge supports {', '.join(SUPPORTED)} today (README: Platforms)"
        )

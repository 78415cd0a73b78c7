"""Fork hygiene for worker processes started inside Prefect tasks (imports nothing heavy)."""

from __future__ import annotations

import sys
import threading
from typing import Any

__all__ = ["forget_inherited_prefect_services"]

_SERVICES_MODULE = "prefect._internal.concurrency.services"


def _owner(hook: Any) -> Any:
    return getattr(getattr(hook, "func", hook), "__self__", None)


def forget_inherited_prefect_services(worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: drop at-exit hooks of Prefect services copied by ``fork``.

    Prefect 3.9 resets its log and event services in a forked child but leaves their
    ``threading`` at-exit hooks registered; when the child exits the hooks fail an assertion,
    the worker exits with code 1, and torch reports "DataLoader worker exited unexpectedly".
    Those services are dead in the child (their event-loop thread was not copied), so their
    hooks have nothing to flush. Under spawn Prefect is not loaded and this does nothing; it
    also does nothing if Prefect renames what it relies on.
    """
    services = sys.modules.get(_SERVICES_MODULE)
    base = getattr(services, "_QueueServiceBase", None)
    hooks = getattr(threading, "_threading_atexits", None)
    if base is None or not isinstance(hooks, list):
        return
    hooks[:] = [h for h in hooks if not isinstance(_owner(h), base)]

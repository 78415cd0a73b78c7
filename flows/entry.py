"""Flows that a Python script calls directly: spawn-safe, and ending every process they start.

``build_dataset(BuildConfig(...))`` from a user's script is an entry point like the console
script, so it behaves like one:

- called where every spawned child would run it again (the module level of the main script, or
  a child re-importing it), it fails at once, before Prefect starts anything, with the
  ``if __name__ == "__main__":`` fix (:func:`h5forge.main_guard.check_entry_point`);
- with no Prefect API configured (no ``PREFECT_API_URL``), it starts Prefect's temporary
  local server for the call and stops it when the call ends, however it ends (a result, an
  exception, Ctrl-C), after the run's last logs and events were delivered to it; Prefect's own
  ephemeral mode would keep that server until the interpreter exits. A configured API (a
  persistent server, ``h5forge server start``; Prefect Cloud) is used as it is.

Prefect runs a deployment's flow through its engine, not through ``__call__``, so served and
worker runs are unchanged; so is a call from inside another flow or task, which already has
its server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prefect import Flow
from prefect.context import FlowRunContext, TaskRunContext
from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

from h5forge.main_guard import check_entry_point

__all__ = ["SERVER_STARTUP_S", "EntryFlow", "entry_flow"]

# Prefect's own bound for its temporary server is 20 s, which a first start (it creates the
# database) overran on a busy 2-core machine; a larger user setting wins.
SERVER_STARTUP_S = 180

F = TypeVar("F", bound=Callable[..., Any])


class EntryFlow(Flow[Any, Any]):
    """A :class:`prefect.Flow` whose direct call is spawn-safe and brings its own server."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        check_entry_point(self.fn.__name__)
        if (
            FlowRunContext.get() is not None
            or TaskRunContext.get() is not None
            or get_current_settings().api.url
        ):
            return super().__call__(*args, **kwargs)
        return self._call_with_server(args, kwargs)

    def _call_with_server(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()
        if server.running:  # someone else's (Prefect's ephemeral mode): theirs to stop
            with temporary_settings({PREFECT_API_URL: server.api_url}):
                return super().__call__(*args, **kwargs)
        bound = get_current_settings().server.ephemeral.startup_timeout_seconds
        server.start(timeout=max(SERVER_STARTUP_S, bound))
        try:
            with temporary_settings({PREFECT_API_URL: server.api_url}):
                try:
                    return super().__call__(*args, **kwargs)
                finally:  # the run's last logs and events, while the server still takes them
                    APILogWorker.drain_all(timeout=30)
                    EventsWorker.drain_all(timeout=30)
        finally:
            server.stop()


def entry_flow(**options: Any) -> Callable[[F], EntryFlow]:
    """Like ``@prefect.flow(**options)``, making an :class:`EntryFlow`."""

    def wrap(fn: F) -> EntryFlow:
        return EntryFlow(fn=fn, **options)

    return wrap

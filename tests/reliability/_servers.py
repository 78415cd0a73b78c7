"""The test suite's loopback HTTP and S3 servers, usable outside pytest (campaign script).

They reuse the fixtures' server classes (``tests/fixtures/servers.py``) so the campaign and the
fast subsets exercise the same fault injection.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.fixtures.servers import LoopbackHTTP, _Handler, _Server

__all__ = ["RestartableS3", "loopback_http", "s3_env"]


@contextmanager
def loopback_http() -> Iterator[LoopbackHTTP]:
    """A loopback HTTP server with programmable faults (see ``LoopbackHTTP``)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    host, port = server.server_address[:2]
    server.state = LoopbackHTTP(base_url=f"http://{host!s}:{port}")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.state
    finally:
        server.state.released.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def s3_env() -> dict[str, str]:
    """AWS settings that keep botocore away from real credentials and metadata endpoints."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


class RestartableS3:
    """A moto S3 server on a fixed loopback port that can be stopped and started again.

    moto keeps its buckets in process memory, so a restart on the same port comes back with
    the same content, like an object store that was unreachable for a while.
    """

    def __init__(self) -> None:
        import logging

        from moto.moto_server.threaded_moto_server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request lines
        self._cls = ThreadedMotoServer
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.port = port
        self.endpoint_url = f"http://{host}:{port}"
        self.running = True

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        """s3fs options for this server (short timeouts, few retries: faults show quickly)."""
        return {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": self.endpoint_url},
            "config_kwargs": {
                "connect_timeout": 2,
                "read_timeout": 5,
                "retries": {"max_attempts": 2, "mode": "standard"},
            },
            "skip_instance_cache": True,
            **extra,
        }

    def stop(self) -> None:
        if self.running:
            self.server.stop()
            self.running = False

    def start(self) -> None:
        if not self.running:
            self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
            self.server.start()
            self.running = True

    def close(self) -> None:
        self.stop()

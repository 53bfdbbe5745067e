"""Run the extender app under real uvicorn on loopback in a background thread (tests and benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class LoopbackServer:
    """``with LoopbackServer(app) as srv: srv.url`` — a real uvicorn HTTP server on 127.0.0.1, ephemeral port."""

    def __init__(self, app: Any, *, log_level: str = "warning") -> None:
        import uvicorn

        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("extender server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

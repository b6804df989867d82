"""Serve an app from a background thread (tests, in-process benchmarks)."""
from __future__ import annotations

import socket
import threading
import time


# Longer than clients' idle expiry (httpx's, so openai-python's: 5 s): the client then
# closes an idle connection first. Were the server to close it at the same moment, a
# request the client had just sent on it would be reset, unread.
KEEP_ALIVE_SECONDS = 75


class ServerThread:
    """Serve an app from a background thread on a socket bound before start
    (port 0 = a free port, no race): for tests and in-process benchmarks."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5,
                                                    timeout_keep_alive=KEEP_ALIVE_SECONDS))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="verispec-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()

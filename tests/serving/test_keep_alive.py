"""The server keeps an idle connection open past clients' idle expiry (httpx's 5 s), so
the client closes it first and never sends a request into a server-side close."""
from __future__ import annotations

import socket
import time

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from verispec.serving.background import KEEP_ALIVE_SECONDS, ServerThread


def _app() -> Starlette:
    return Starlette(routes=[Route("/ping", lambda request: PlainTextResponse("pong"))])


def _get(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /ping HTTP/1.1\r\nHost: test\r\n\r\n")
    reply = b""
    while not reply.endswith(b"pong"):
        chunk = sock.recv(4096)
        if not chunk:
            return reply
        reply += chunk
    return reply


def test_an_idle_connection_outlives_the_clients_expiry():
    client_expiry = httpx.Limits().keepalive_expiry
    assert KEEP_ALIVE_SECONDS > client_expiry
    with ServerThread(_app()) as server, socket.create_connection((server.host, server.port), timeout=10) as sock:
        assert _get(sock).startswith(b"HTTP/1.1 200")
        time.sleep(client_expiry + 1)  # uvicorn's own default (5 s) has closed it by now
        assert _get(sock).startswith(b"HTTP/1.1 200")

"""Shared pieces of the Ray Serve tests: ports, HTTP, process checks, the small model."""
from __future__ import annotations

import http.client
import json
import shutil
import socket
import time
from pathlib import Path

import psutil
from conftest import tiny_llama

from verispec.models import loading

REPO = Path(__file__).resolve().parents[1]
PREFIX = 48  # the app's prefix_chars here
SETTINGS = {"dtype": "fp32", "backend": "hf", "replicas": 2, "proposer": "ngram", "k": "auto",
            "max_num_seqs": 4, "max_queue": 16, "prefix_chars": PREFIX, "threads": 1,
            "shutdown_timeout": 5}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if psutil.pid_exists(pid)
                 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.2)
    return alive


def post(port: int, path: str, body, timeout: float = 60) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, dict(response.getheaders()), text


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, text


def small_model_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama with the default model's tokenizer and chat template."""
    folder = tmp_path_factory.mktemp("ray-small")
    tiny_llama(0, vocab=49152, layers=2, max_positions=512).save_pretrained(folder)
    source = loading.resolve_model_dir(None)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder



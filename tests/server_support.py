"""What the server tests share: a character tokenizer with a chat template, a tiny model's
server in a background thread, the openai client on it, and a raw HTTP call that returns the
status and body as they came."""
from __future__ import annotations

import http.client

import openai
from conftest import CharTokenizer

from verispec.serving.protocol import ServeDefaults
from verispec.serving.scheduler import SchedulerConfig
from verispec.serving.server import ServerConfig, ServerThread, create_app


class ChatCharTokenizer(CharTokenizer):
    chat_template = "test"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return self.encode("".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]")


def raw(server, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    return response.status, text


def tiny_server(engine, max_num_seqs: int = 4, max_queue: int = 16, **defaults) -> ServerThread:
    """A server on `engine` (model name "tiny") in a background thread, as a context manager;
    `defaults` are the ServeDefaults (proposer, k, adaptive, ...)."""
    config = ServerConfig(("tiny",), ServeDefaults(**defaults),
                          SchedulerConfig(max_num_seqs=max_num_seqs, max_queue=max_queue))
    return ServerThread(create_app(engine, config))


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

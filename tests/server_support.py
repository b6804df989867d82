"""What the server tests share: a character tokenizer with a chat template, and a raw HTTP
call that returns the status and body as they came."""
from __future__ import annotations

import http.client

from conftest import CharTokenizer


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

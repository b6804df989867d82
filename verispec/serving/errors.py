"""The OpenAI-style error every bad request becomes: HTTP 400 (or the status
given) with the body `{"error": {"message", "type", "param", "code"}}`."""
from __future__ import annotations


class APIError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = "invalid_value",
                 status: int = 400, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}

"""Errors shaped like Google's JSON error bodies (``{"error": {"code", "message", "status"}}``)."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An API failure the server turns into a Google-shaped JSON error response.

    :param code: HTTP status code.
    :param status: canonical gRPC status name, e.g. ``INVALID_ARGUMENT``.
    :param message: human-readable message, worded like Google's where we know it.
    :param headers: extra response headers (``Retry-After`` for 429).
    """

    def __init__(self, code: int, status: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


def invalid_argument(message: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", message)


def not_found(message: str = "Requested entity was not found.") -> ApiError:
    return ApiError(404, "NOT_FOUND", message)

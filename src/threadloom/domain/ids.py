"""App-owned identifiers.

Ids are UUIDv7: time-ordered, so keyset pagination by id follows creation order and
B-tree inserts stay append-mostly. Provider ids are never keys; they are stored as refs.
"""

from __future__ import annotations

import base64
import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id() -> uuid.UUID:
    """A UUIDv7 that is strictly increasing within this process."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _counter += 1
            if _counter >= 1 << 12:
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        rand_a = _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= rand_a << 64
    value |= 0b10 << 62
    value |= rand_b
    return uuid.UUID(int=value)


def global_id(type_name: str, value: uuid.UUID) -> str:
    """The API's opaque id of an object: base64url of `Type:uuid`, unpadded (`api.ids` decodes it). Here so a
    webhook body, built below the API, names objects as the API does."""
    return base64.urlsafe_b64encode(f"{type_name}:{value}".encode()).decode().rstrip("=")

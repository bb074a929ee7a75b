"""Standard Webhooks 1.0 signatures (docs/webhooks.md, "Verifying a delivery").

A secret is `whsec_` + base64 of 32 random bytes; the key is those bytes. A signature is `v1,` + base64 of
HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{body}"). While a rotated-out secret is still in its grace
period both sign, and the `webhook-signature` header holds both, space separated, so a receiver that has either
secret verifies.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
VERSION = "v1"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(os.urandom(SECRET_BYTES)).decode()


def key_of(secret: str) -> bytes:
    """The HMAC key of a `whsec_` secret (its base64 part decoded)."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with whsec_")
    try:
        return base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error as error:
        raise ValueError("a webhook secret's key is base64") from error


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key_of(secret), signed, hashlib.sha256).digest()
    return f"{VERSION},{base64.b64encode(digest).decode()}"


def signature_header(secrets: Sequence[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: one signature per secret that signs now (the current one first)."""
    return " ".join(sign(secret, message_id, timestamp, body) for secret in secrets)


def secret_hint(secret: str) -> str:
    """Enough of a secret to tell two apart in a list (its last four characters), never enough to use it."""
    return f"{SECRET_PREFIX}…{secret[-4:]}"

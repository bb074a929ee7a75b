"""Where a webhook may go (docs/webhooks.md, "Egress rules"): a webhook must not become a way to reach the
server's own network.

Only `https://`; `http://` only to a loopback address and only when the operator allows loopback targets. Every
address a host resolves to is checked, at creation (literal addresses) and again at each attempt, which then
connects to the address it checked (a name that resolves elsewhere a second later is never asked again).
Loopback needs `THREADLOOM_WEBHOOK_ALLOW_LOOPBACK=1`, private networks `THREADLOOM_WEBHOOK_ALLOW_PRIVATE=1`;
link-local (cloud metadata), multicast, unspecified and reserved addresses are never allowed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from urllib.parse import urlsplit

from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.webhooks import WebhookPolicy

MAX_URL = 2048
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A checked URL, split for the request: connect to `host`:`port`, ask for `path`, name `host_header`."""

    url: str
    scheme: str
    host: str
    port: int
    path: str
    host_header: str

    @property
    def tls(self) -> bool:
        return self.scheme == "https"


def _refused_url(message: str) -> DomainError:
    return DomainError(ErrorCode.WEBHOOK_URL_NOT_ALLOWED, message, "url")


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _loopback_host(host: str) -> bool:
    literal = _literal(host)
    return host.lower() in LOOPBACK_NAMES if literal is None else _unmapped(literal).is_loopback


def _unmapped(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def parse(url: str, policy: WebhookPolicy) -> Target:
    """The target of `url`, or WEBHOOK_URL_NOT_ALLOWED (its form or scheme) / WEBHOOK_TARGET_NOT_ALLOWED (a
    literal address the rules refuse). A host name is checked when it is resolved, at each attempt."""
    text = url.strip()
    if not text or len(text) > MAX_URL or any(ch.isspace() or ord(ch) < 32 for ch in text):
        raise _refused_url(f"url: an absolute https:// URL of at most {MAX_URL} characters")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise _refused_url("url: not a valid URL") from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in ("https", "http") or not host:
        raise _refused_url("url: only https:// URLs (http:// only to a loopback address the operator allows)")
    if parts.username is not None or parts.password is not None:
        raise _refused_url("url: credentials in the URL are not allowed (the signature authenticates a delivery)")
    if parts.fragment:
        raise _refused_url("url: no #fragment")
    if scheme == "http" and not (policy.allow_loopback and _loopback_host(host)):
        raise _refused_url(
            "url: http:// only to a loopback address, where the operator sets THREADLOOM_WEBHOOK_ALLOW_LOOPBACK=1; "
            "use https://"
        )
    literal = _literal(host)
    if literal is not None:
        reason = refused_address(str(literal), scheme, policy)
        if reason is not None:
            raise DomainError(ErrorCode.WEBHOOK_TARGET_NOT_ALLOWED, f"url: {reason}", "url")
    elif host.lower() in LOOPBACK_NAMES and not policy.allow_loopback:
        raise DomainError(ErrorCode.WEBHOOK_TARGET_NOT_ALLOWED, "url: a loopback target is not allowed", "url")
    default = 443 if scheme == "https" else 80
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    shown = f"[{host}]" if literal is not None and literal.version == 6 else host
    host_header = shown if port in (None, default) else f"{shown}:{port}"
    return Target(text, scheme, host, port or default, path, host_header)


def refused_address(address: str, scheme: str, policy: WebhookPolicy) -> str | None:
    """Why a delivery may not connect to `address` (None: it may)."""
    try:
        ip = _unmapped(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return f"{address} is not an IP address"
    if ip.is_loopback:
        return None if policy.allow_loopback else f"{ip} is a loopback address"
    if ip.is_unspecified or ip.is_multicast or ip.is_link_local or ip.is_reserved:
        return f"{ip} is not a unicast address on a network a webhook may reach"
    if scheme != "https":
        return f"http:// only to a loopback address, not {ip}"
    if ip.is_global:
        return None
    return None if policy.allow_private else f"{ip} is a private address"

"""One webhook POST, on asyncio streams (docs/webhooks.md, "Egress rules").

Our own small HTTP/1.1 client rather than a library, for three properties that are easy to get exactly here and
awkward through a general client: the host is resolved once, every address it gives is checked
(`domain.webhook_egress.refused_address`), and the connection goes to an address that was checked (TLS still
verifies the certificate against the URL's host name), so a name that resolves elsewhere between a check and a
connect is never asked again; a redirect is just a non-2xx answer (nothing is followed); and only the answer's
status line is read (at most `MAX_STATUS_LINE` bytes), never its body. One timeout bounds the whole attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import socket
import ssl

from threadloom.domain.webhook_egress import Target, refused_address
from threadloom.domain.webhooks import AttemptError, WebhookPolicy

MAX_STATUS_LINE = 1024
USER_AGENT = "Threadloom-Webhooks/1.0"


@functools.cache
def _tls() -> ssl.SSLContext:
    """Made on the first https delivery, not at import: reading the CA bundle is ~30 ms of every start."""
    return ssl.create_default_context()


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    status_code: int | None  # None: no HTTP answer
    error: AttemptError | None  # None: a 2xx
    message: str | None = None


def _request(target: Target, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {target.path} HTTP/1.1", f"Host: {target.host_header}", f"User-Agent: {USER_AGENT}"]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _addresses(target: Target) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _attempt(target: Target, body: bytes, headers: dict[str, str], policy: WebhookPolicy) -> Answer:
    try:
        addresses = await _addresses(target)
    except (socket.gaierror, UnicodeError) as error:
        return Answer(None, AttemptError.DNS_FAILED, f"{target.host} did not resolve: {error}")
    for address in addresses:
        reason = refused_address(address, target.scheme, policy)
        if reason is not None:
            return Answer(None, AttemptError.TARGET_NOT_ALLOWED, f"{target.host} resolves to {reason}")
    streams = None
    failure = "no address"
    for address in addresses:
        try:
            streams = await asyncio.open_connection(
                address,
                target.port,
                ssl=_tls() if target.tls else None,
                server_hostname=target.host if target.tls else None,
                limit=MAX_STATUS_LINE,
            )
            break
        except (OSError, ssl.SSLError) as error:
            failure = f"{address}: {error}"
    if streams is None:
        return Answer(None, AttemptError.CONNECTION_FAILED, failure)
    reader, writer = streams
    try:
        writer.write(_request(target, body, headers))
        await writer.drain()
        line = await reader.readuntil(b"\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ssl.SSLError) as error:
        return Answer(
            None,
            AttemptError.INVALID_RESPONSE
            if isinstance(error, asyncio.LimitOverrunError)
            else AttemptError.CONNECTION_FAILED,
            str(error) or type(error).__name__,
        )
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    parts = line.decode("latin-1").split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
        return Answer(None, AttemptError.INVALID_RESPONSE, f"not an HTTP status line: {line[:80]!r}")
    code = int(parts[1])
    if 200 <= code < 300:
        return Answer(code, None)
    note = " (redirects are not followed: update the endpoint's URL)" if 300 <= code < 400 else ""
    return Answer(code, AttemptError.HTTP_STATUS, f"answered {code}{note}")


async def post(target: Target, body: bytes, headers: dict[str, str], policy: WebhookPolicy) -> Answer:
    """POST `body` to `target` under the policy's timeout; never raises for what the receiver does."""
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _attempt(target, body, headers, policy)
    except TimeoutError:
        return Answer(None, AttemptError.TIMEOUT, f"no answer within {policy.timeout_s:g} s")

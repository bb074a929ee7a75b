"""An idle HTTP connection stays open longer than clients keep theirs, then the server closes it.

uvicorn closes an idle connection after 5 s by default, which is exactly how long httpx keeps one in its pool:
a request sent on a connection idle about that long now and then met the server's close and failed with a read
error (seen in a full run). The server keeps idle connections for `THREADLOOM_KEEP_ALIVE_SECONDS` (75 s by
default, above httpx's expiry and load balancers' usual 60 s idle timeout).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.support.pg import PgServer
from tests.support.server import ServerProcess
from threadloom.config import Settings

SHARED_SERVER = True
READY = b"GET /readyz HTTP/1.1\r\nHost: test\r\n\r\n"


def _answer(conn: socket.socket) -> bytes:
    """The status line of the response to READY on `conn`, read whole (headers and body) so nothing of it is left
    for the next read."""
    conn.settimeout(30)
    conn.sendall(READY)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed mid-response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "the connection closed mid-body"
        body += chunk
    return head.split(b"\r\n", 1)[0]


def _closed_by_server(conn: socket.socket, within: float) -> bool:
    """Whether the server closes `conn` (end of stream) within `within` seconds."""
    conn.settimeout(within)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False


def test_the_default_keep_alive_outlasts_client_pools_and_load_balancers() -> None:
    kept = Settings.from_env().keep_alive_seconds
    assert kept > httpx.Limits().keepalive_expiry  # httpx's 5 s: the client always lets go first
    assert kept > 60  # the usual idle timeout of a load balancer in front


async def test_an_idle_connection_is_closed_after_its_keep_alive_and_kept_open_before(
    server: ServerProcess, pg: PgServer, tmp_path: Path
) -> None:
    """A server told 1 s closes an idle connection by itself. The default server's connection, idle since before
    that one's (with uvicorn's 5 s on both, it would be closed first), still answers on the same socket."""
    short = ServerProcess(await pg.fresh(), tmp_path / "data", env={"THREADLOOM_KEEP_ALIVE_SECONDS": "1"})
    short.wait_ready()
    try:
        kept = socket.create_connection(("127.0.0.1", server.port))
        brief = socket.create_connection(("127.0.0.1", short.port))
        with brief, kept:
            assert _answer(kept) == b"HTTP/1.1 200 OK"
            assert _answer(brief) == b"HTTP/1.1 200 OK"
            idle_since = time.monotonic()
            assert _closed_by_server(brief, within=30), "the 1 s server kept its idle connection"
            assert time.monotonic() - idle_since >= 0.9  # closed for being idle, not at once
            assert _answer(kept) == b"HTTP/1.1 200 OK"  # idle longer than `brief` was, and still open
    finally:
        short.stop()

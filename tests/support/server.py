"""A real `threadloom serve` process (uvicorn) on a free port, and a small HTTP client."""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import queue
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support import processes, zygote
from tests.support.http_post import Connections


def pg_broadcast_url(database_url: str) -> str:
    """`BROADCAST_URL` for servers sharing `database_url`: wake-ups over its PostgreSQL (LISTEN/NOTIFY). Without
    it each server wakes only its own subscribers and learns of another's writes at the next poll (5 s)."""
    return database_url.replace("postgresql+asyncpg://", "postgresql://")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for every test client: httpx builds one per client otherwise (the CA bundle read
    again, ~20 ms of CPU), and the suite makes thousands of clients, all for plain-HTTP servers."""
    return httpx.create_ssl_context()


def _ready(port: int) -> bool:
    """Whether the server on `port` answers /readyz with 200. Plain `http.client`: an `httpx.get` builds a TLS
    context (the CA bundle read again) on every call, which made this poll a visible part of the suite's CPU."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


class ServerProcess:
    def __init__(
        self,
        database_url: str | None,
        data_dir: Path,
        env: dict[str, str] | None = None,
        port: int | None = None,
        *,
        fork: bool | None = None,
    ) -> None:
        """`fork`: forked from a process that imported the server already (tests/support/zygote.py); by
        default for a server on a given database. False: the real `python -m threadloom serve`."""
        self.port = port or free_port()  # a given port: a restart clients reconnect to at the same address
        self.database_url, self.data_dir = database_url, data_dir
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token: str | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        full_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        # Strict: a git or agent call inside a database transaction raises (threadloom.io_guard).
        # XDG_STATE_HOME: the server announces itself there (threadloom.server_state), never in the user's home.
        full_env.update({"THREADLOOM_DATA_DIR": str(data_dir), "THREADLOOM_STRICT_TRANSACTIONS": "1"})
        full_env.update({"XDG_STATE_HOME": str(data_dir / "xdg-state"), **(env or {})})
        if database_url is not None:
            full_env["DATABASE_URL"] = database_url
        argv = ["serve", "--port", str(self.port)]
        if fork if fork is not None else database_url is not None and zygote.enabled():
            self.proc: subprocess.Popen[str] | zygote.Forked = zygote.Forked(argv, full_env)
        else:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "threadloom", *argv],
                env=full_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._pump_err, args=(self.proc.stderr,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def _pump_err(self, stream: Any) -> None:
        for line in stream:
            self.log.append(line.rstrip("\n"))

    def wait_ready(self, timeout: float = 30.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while not self.lines.empty():
                line = self.lines.get()
                if line.startswith("Admin token"):
                    self.admin_token = line.rsplit(" ", 1)[1]
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n" + "\n".join(self.log[-80:]))
            if _ready(self.port):
                while not self.lines.empty():
                    line = self.lines.get()
                    if line.startswith("Admin token"):
                        self.admin_token = line.rsplit(" ", 1)[1]
                return self
            time.sleep(0.02)
        raise TimeoutError("server did not become ready:\n" + "\n".join(self.log[-80:]))

    def report(self, tail: int = 60, since: int = 0) -> str:
        """The log from line `since` on, for a failed test: its warnings and errors first (a traceback is
        usually far above the last requests), then its last `tail` lines."""
        lines = self.log[since:]
        serious = [line for line in lines if not line.startswith('{"ts"') or '"level":"info"' not in line]
        head = "\n".join(serious[-200:])
        return f"--- warnings and errors\n{head}\n--- last {tail} lines\n" + "\n".join(lines[-tail:])

    def stop(self) -> None:
        processes.stop(self.proc)

    def kill(self) -> None:
        processes.kill(self.proc)


class Client:
    """GraphQL over HTTP with a bearer token."""

    def __init__(self, base_url: str, token: str | None) -> None:
        self.base_url = base_url
        self.token = token
        self._posts = Connections(base_url, timeout=30)
        self._http: httpx.AsyncClient | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        """httpx, for what `post` does not do (GETs, streams read line by line, other bodies); made on first use."""
        if self._http is None:
            self._http = httpx.AsyncClient(base_url=self.base_url, timeout=30, verify=tls_context())
        return self._http

    def headers(self, token: str | None = None) -> dict[str, str]:
        tok = token if token is not None else self.token
        return {"authorization": f"Bearer {tok}"} if tok else {}

    async def post(self, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> httpx.Response:
        """The GraphQL request as JSON (tests/support/http_post.py: plain asyncio, an httpx.Response back)."""
        headers = {**self.headers(kw.pop("token", None)), **kw.pop("headers", {})}
        body = {"query": query, "variables": variables or {}}
        if kw:
            return await self.http.post("/graphql", json=body, headers=headers, **kw)
        return await self._posts.post("/graphql", body, headers)

    async def gql(self, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """Data of a successful request; fails the test on any top-level error."""
        response = await self.post(query, variables, **kw)
        body = response.json()
        assert response.status_code == 200, body
        assert "errors" not in body, body
        return body["data"]  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        await self._posts.aclose()
        if self._http is not None:
            await self._http.aclose()


def providers_env(folder: Path, providers_toml: str, **env: str) -> dict[str, str]:
    """The environment of a server whose provider instances are `providers_toml` (written into `folder`)."""
    config = folder / "providers.toml"
    config.write_text(providers_toml)
    return {"THREADLOOM_PROVIDERS": str(config), **env}


@contextlib.contextmanager
def serving(
    database_url: str, data_dir: Path, env: dict[str, str] | None = None, *, fork: bool | None = None
) -> Iterator[ServerProcess]:
    """A ready server for one test (`fork` as in `ServerProcess`). Afterwards it is stopped and the tail of its
    log printed, which pytest shows only when the test failed."""
    proc = ServerProcess(database_url, data_dir, env=env, fork=fork).wait_ready()
    yield proc
    proc.stop()
    print(proc.report())

"""A real Redis (Debian's `redis-server`) on a free port, in a folder of its own, for `BROADCAST_URL=redis://…`.

Nothing is persisted (no RDB, no AOF): the wake-ups it carries are never the source of truth. `stop()` ends
it with SIGTERM; `kill()` with SIGKILL, as a crashed Redis would go.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import processes
from tests.support.server import free_port


class RedisServer:
    def __init__(self, folder: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server; scripts/test does)")
        folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = folder / "redis.log"
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder)]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", str(self.log)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ping(self) -> bool:
        """True when Redis answers PING (RESP inline command) on its port."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def wait_ready(self, timeout: float = 10.0) -> RedisServer:
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: {self._tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server did not answer PING: {self._tail()}")
            time.sleep(0.02)
        return self

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()[-2000:]
        return ""

    def stop(self) -> None:
        processes.stop(self.proc)

    def kill(self) -> None:
        processes.kill(self.proc)


@contextlib.contextmanager
def running_redis(folder: Path) -> Iterator[RedisServer]:
    server = RedisServer(folder).wait_ready()
    try:
        yield server
    finally:
        server.stop()

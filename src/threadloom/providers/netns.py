"""A network namespace of its own, connected outwards by `pasta`, for agents allowed the network.

`full_access` widens an agent's network, never to Threadloom itself: the metrics port (token-less, bound to
127.0.0.1), the main port on loopback and whatever else listens on the host's loopback or in its abstract
Unix socket namespace must stay out of reach. A command sharing the host's network sees all of that. So a
networked agent gets a fresh network namespace: its loopback is its own (empty), and `pasta` (Debian's
`passt` package) gives it one interface with the host's addresses and a default route whose traffic pasta
relays through ordinary sockets of the host — outbound connectivity, as an unprivileged process would have.

pasta is started with:

- `--no-map-gw`: the gateway address is NOT mapped to the host's loopback (pasta's default does that);
- `-t none -u none`: nothing of the host is forwarded into the namespace, `-U none`: no UDP outwards to
  the host's loopback;
- `-T <ports>`: the only way to the host's loopback, each listed TCP port of the namespace's loopback
  relayed to the same port on the host's. Used only for a model endpoint that is itself on loopback (a
  local model server, the tests' fake model), never for Threadloom's own ports (`loopback_ports`).

How it nests: this module's `main` (run as `python -m threadloom.providers.netns`) forks the command, which
unshares a network namespace (plus a user namespace when not root, mapping its own uid and gid to
themselves so the command stays the same unprivileged user) and waits; the parent attaches pasta to it and
only then lets the command run, so its first connection already has the network. pasta opens the
namespace through a descriptor this process holds (`/proc/self/fd/N`): as root, pasta drops capabilities
and may no longer open another root process's `/proc/PID/ns` files itself. pasta's own "start a command"
mode is not used because as root it runs the command unmapped (as the overflow uid) in a user namespace.
The parent waits for the command, stops pasta (which would otherwise outlive the namespace) and exits
with the command's status. It runs inside `contained()`'s PID namespace, so a killed launcher takes pasta
along too, and under whatever uid the agent runs as: pasta needs no privilege.

Without pasta, nothing falls back to the host's network: `isolated` raises `NetworkSandboxUnavailable`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from urllib.parse import urlsplit

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SETUP_FAILED = 125  # the launcher's exit status when the namespace could not be set up
INSTALL_HINT = "install it with `apt-get install passt`"


class NetworkSandboxUnavailable(OSError):
    """`pasta` is missing: a networked agent cannot get a network of its own, so it does not run."""


def find_pasta() -> str | None:
    """The `pasta` executable, or None."""
    return shutil.which("pasta") or next((p for p in ("/usr/bin/pasta", "/bin/pasta") if os.access(p, os.X_OK)), None)


def isolated(argv: Sequence[str], forward_tcp: Sequence[int] = ()) -> list[str]:
    """`argv` run in a network namespace of its own with outbound connectivity through pasta; `forward_tcp`
    are the host loopback ports its own loopback relays to (a loopback model endpoint only).

    Raises `NetworkSandboxUnavailable` when pasta is not installed: never the host's network instead."""
    pasta = find_pasta()
    if pasta is None:
        raise NetworkSandboxUnavailable(
            f"pasta (from the passt package) is not installed: an agent allowed the network cannot get a "
            f"network namespace of its own, and never gets the host's; {INSTALL_HINT}"
        )
    ports = ",".join(str(port) for port in sorted(set(forward_tcp))) or "none"
    return [sys.executable, "-m", "threadloom.providers.netns", pasta, ports, "--", *argv]


def loopback_ports(url: str | None) -> tuple[int, ...]:
    """The port to forward for a model endpoint `url` when its host is on loopback, else none: an agent
    reaches a remote endpoint through pasta like any other address, and a loopback one only this way."""
    if not url:
        return ()
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        on_loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        on_loopback = False
    if not on_loopback:
        return ()
    try:
        port = parts.port
    except ValueError:
        return ()
    return (port or (443 if parts.scheme == "https" else 80),)


def _unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare: {os.strerror(code)}")


def _run_child(argv: list[str], ready_w: int, go_r: int) -> None:
    """In the forked child: a namespace of its own, then wait for the parent's go, then `argv`."""
    try:
        _unshare(CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWNET | CLONE_NEWUSER)
        os.write(ready_w, b"1")
        os.close(ready_w)
        if os.read(go_r, 1) != b"1":
            os._exit(SETUP_FAILED)
        os.close(go_r)
        os.execvp(argv[0], argv)
    except OSError as error:
        sys.stderr.write(f"threadloom netns: {argv[0]}: {error.strerror}\n")
        sys.stderr.flush()
        os._exit(127 if error.errno == errno.ENOENT else SETUP_FAILED)


def _attach(pasta: str, ports: str, pid: int) -> int:
    """Attach pasta to the namespaces of `pid`, configured before this returns; pasta's pid."""
    uid, gid = os.geteuid(), os.getegid()
    keep: list[int] = []
    try:
        if uid != 0:
            with open(f"/proc/{pid}/uid_map", "w") as f:
                f.write(f"{uid} {uid} 1")
            with open(f"/proc/{pid}/setgroups", "w") as f:
                f.write("deny")
            with open(f"/proc/{pid}/gid_map", "w") as f:
                f.write(f"{gid} {gid} 1")
        net = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        keep.append(net)
        target = ["--netns", f"/proc/self/fd/{net}", "--netns-only"]
        if uid != 0:
            user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
            keep.append(user)
            target = ["--userns", f"/proc/self/fd/{user}", "--netns", f"/proc/self/fd/{net}"]
        pid_r, pid_w = os.pipe()  # pasta writes its daemon's pid here (-P)
        keep += [pid_r, pid_w]
        command = [pasta, "--quiet", "--runas", f"{uid}:{gid}", "--config-net", "--no-map-gw"]
        command += ["-t", "none", "-u", "none", "-T", ports, "-U", "none", "-P", f"/proc/self/fd/{pid_w}", *target]
        done = subprocess.run(
            command,
            pass_fds=keep,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            check=False,
        )
        if done.returncode != 0:
            lines = [line for line in done.stderr.decode(errors="replace").splitlines() if "syslog" not in line]
            raise OSError(errno.EIO, f"pasta failed ({done.returncode}): {'; '.join(lines)}")
        os.close(pid_w)
        keep.remove(pid_w)
        text = b""
        while not text.endswith(b"\n"):
            chunk = os.read(pid_r, 32)
            if not chunk:
                break
            text += chunk
        return int(text.strip())
    finally:
        for fd in keep:
            os.close(fd)


def main(args: Sequence[str]) -> int:
    """`python -m threadloom.providers.netns PASTA PORTS -- ARGV...` (built by `isolated`)."""
    if len(args) < 4 or args[2] != "--":
        sys.stderr.write("usage: python -m threadloom.providers.netns PASTA PORTS -- ARGV...\n")
        return 2
    pasta, ports, argv = args[0], args[1], list(args[3:])
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        _run_child(argv, ready_w, go_r)
    os.close(ready_w)
    os.close(go_r)
    pasta_pid = None
    try:
        if os.read(ready_r, 1) == b"1":
            pasta_pid = _attach(pasta, ports, pid)
            os.write(go_w, b"1")
    except (OSError, ValueError) as error:
        sys.stderr.write(f"threadloom netns: cannot give the agent a network of its own: {error}\n")
    finally:
        os.close(ready_r)
        os.close(go_w)  # without the go byte the child exits SETUP_FAILED
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            status = SETUP_FAILED << 8
            break
        except InterruptedError:  # pragma: no cover - Python retries waitpid itself
            continue
    if pasta_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pasta_pid, signal.SIGKILL)
    code = os.waitstatus_to_exitcode(status)
    if pasta_pid is None and code == 0:
        code = SETUP_FAILED
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The bubblewrap sandbox every `@tool`, `@approval` command and `@write` runs in.

An agent command is untrusted: it is whatever a user (any holder of an operate token of the project) typed.
So it runs with `bwrap` in fresh namespaces (user, pid, mount, ipc, uts, cgroup and, unless the thread may use
the network, net) and sees only:

- the thread's workspace at its own path, read-write (read-only for `read_only` threads): the one folder the
  project owns;
- `/usr` read-only (with the usual `/bin`, `/sbin`, `/lib`, `/lib64` symlinks into it): the toolchain;
- a handful of `/etc` files a toolchain needs, each bound read-only by name (`ETC_FILES`; the name-service and
  TLS files only when the network is shared). Never the whole `/etc`, never the host root;
- a private, empty `/tmp` (also `HOME`), its own `/proc` (only the sandbox's processes) and a minimal `/dev`.

Everything else does not exist inside: the server's data dir and its database socket, other projects'
workspaces, the server's install (its virtualenv and checkout) and its environment. The environment is cleared
and rebuilt from `PATH`, `HOME` and `LANG` only; `bwrap` itself is started with an equally empty environment,
because the sandbox's pid 1 is a `bwrap` process whose `/proc/1/environ` the command can read. Folders named in
`hidden` (the data dir, when a workspace happens to contain it) are covered with an empty tmpfs.

If `bwrap` is not installed, commands are refused (`SandboxUnavailable`) rather than run unconfined.

A networked command (`full_access` on an instance allowed it) shares the network of a namespace of its own,
not the host's: the whole `bwrap` runs under `threadloom.providers.netns.isolated`, which reaches out through
`pasta` and never reaches the host's loopback (Threadloom's metrics and main ports). Without pasta such a
command is refused (`SandboxUnavailable`) rather than given the host's network.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from threadloom.providers.netns import NetworkSandboxUnavailable, isolated

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_HOME = "/tmp"
# Files of /etc that ordinary tools read: the dynamic loader's cache, the `alternatives` symlinks Debian
# points /usr/bin/awk and friends at, the time zone, and who uid 0 is (for `id`, git, ssh).
ETC_FILES = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime", "/etc/passwd", "/etc/group")
# Added when the network is shared: name resolution and the CA certificates.
NETWORK_ETC_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates")
# The merged-/usr links every sandbox makes (link, target); the checkpoint store's git sandbox uses them too.
SYSTEM_LINKS = (("/bin", "usr/bin"), ("/sbin", "usr/sbin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64"))
BWRAP_ENV = {"PATH": "/usr/bin:/bin"}  # bwrap's own environment (see the module docstring)


class SandboxUnavailable(OSError):
    """`bwrap` is missing or the workspace cannot be sandboxed; the command does not run."""


@dataclasses.dataclass(frozen=True, slots=True)
class Sandbox:
    """How one thread's commands are confined."""

    workspace: Path
    writable: bool = True
    network: bool = False
    hidden: tuple[Path, ...] = ()

    def argv(self, command: list[str], cwd: str) -> list[str]:
        """The `bwrap` command line that runs `command` in `cwd` (inside the workspace) under this sandbox."""
        bwrap = find_bwrap()
        workspace = self.workspace.resolve()
        if workspace == Path("/") or not workspace.is_dir():
            raise SandboxUnavailable(f"cannot sandbox workspace {self.workspace}: not a project folder")
        inside = Path(cwd).resolve()
        if not inside.is_relative_to(workspace):
            raise SandboxUnavailable(f"{cwd} is outside the workspace {workspace}")
        args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        if self.network:
            args.append("--share-net")
        args += ["--ro-bind", "/usr", "/usr"]
        for link, target in SYSTEM_LINKS:
            args += ["--symlink", target, link]
        for name in ETC_FILES + (NETWORK_ETC_FILES if self.network else ()):
            args += ["--ro-bind-try", name, name]
        # /tmp first: the workspace may live under /tmp and must be bound on top of the empty tmpfs.
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        args += ["--bind" if self.writable else "--ro-bind", str(workspace), str(workspace)]
        for folder in self.hidden:
            real = folder.resolve()
            if real.is_relative_to(workspace) and real != workspace:
                args += ["--tmpfs", str(real)]
        args += ["--chdir", str(inside), "--clearenv"]
        args += ["--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", SANDBOX_HOME, "--setenv", "LANG", "C.UTF-8"]
        if not self.network:
            return [*args, "--", *command]
        try:
            return isolated([*args, "--", *command])
        except NetworkSandboxUnavailable as error:
            raise SandboxUnavailable(str(error)) from error


def find_bwrap() -> str:
    """The `bwrap` executable; raises `SandboxUnavailable` with the install hint if there is none."""
    found = shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.access(p, os.X_OK)), None)
    if found is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: agent commands cannot run unconfined; "
            "install it with `apt-get install bubblewrap`"
        )
    return found

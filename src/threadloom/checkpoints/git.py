"""Running git against a shadow repository with a controlled environment.

Nothing of the user's git setup may leak in: no system or global config (hooks, filters, aliases,
excludes, attributes), no GIT_* variables inherited from whoever started Threadloom (a GIT_DIR set
by a hook would point every command at the user's repository). Each call gets a fresh, minimal
environment naming the shadow git dir and its private index.

Only the calls that read the workspace's files get a work tree, and they run sandboxed (`sandbox_argv`);
every other call (ls-files, write-tree, diff-tree, rev-parse, cat-file...) gets none and runs in `/`.
Those of them that rewrite the index keep its time (`Git.rewrite_index`), or git's racy-entry guard breaks.
Nothing of ours lets git write the workspace: restore writes files itself (`confine.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from threadloom import io_guard, subprocesses
from threadloom.agent.sandbox import BWRAP_ENV, SANDBOX_PATH, SYSTEM_LINKS, SandboxUnavailable, find_bwrap
from threadloom.checkpoints.errors import CheckpointError, CheckpointErrorCode

SANDBOX_WORKSPACE = "/workspace"  # where a sandboxed git call sees the workspace (its work tree and cwd)

# Settings written into every shadow repository's config (and so never read from the user's).
SHADOW_CONFIG: dict[str, str] = {
    "core.bare": "true",
    "core.autocrlf": "false",
    "core.safecrlf": "false",
    "core.symlinks": "true",
    "core.filemode": "true",
    "core.ignorecase": "false",
    "core.precomposeunicode": "false",
    "core.protectNTFS": "false",  # Linux names like `git~1` are ordinary files here
    "core.protectHFS": "false",
    "core.fsmonitor": "false",
    "core.untrackedCache": "false",
    "core.hooksPath": "/dev/null",
    "core.excludesFile": "/dev/null",
    "core.attributesFile": "/dev/null",
    "core.quotePath": "false",
    "core.logAllRefUpdates": "false",
    "gc.auto": "0",
    "gc.autoDetach": "false",
    "index.version": "4",
    "commit.gpgSign": "false",
    "diff.renames": "false",
    "user.name": "Threadloom",
    "user.email": "checkpoints@threadloom.invalid",
}

# `$GIT_DIR/info/attributes` outranks every .gitattributes in the workspace: no line-ending
# conversion, no filters (LFS), no re-encoding, no ident expansion, so a restore gives back the
# exact bytes that were captured; diff drivers are reset to git's built-in text/binary detection.
SHADOW_ATTRIBUTES = "* -text !eol -filter -ident -working-tree-encoding !diff !merge\n"

IDENTITY = {
    "GIT_AUTHOR_NAME": "Threadloom",
    "GIT_AUTHOR_EMAIL": "checkpoints@threadloom.invalid",
    "GIT_COMMITTER_NAME": "Threadloom",
    "GIT_COMMITTER_EMAIL": "checkpoints@threadloom.invalid",
}


def find_git() -> str:
    """The git executable, or GIT_NOT_FOUND."""
    found = shutil.which("git")
    if found is None:
        raise CheckpointError(CheckpointErrorCode.GIT_NOT_FOUND, "git is not installed (not found on PATH)")
    return found


@dataclass(frozen=True, slots=True)
class GitResult:
    returncode: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one git call: its argv, environment, cwd and the descriptors it inherits."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Git:
    """git bound to one shadow repository (and, for the calls that read it, one workspace)."""

    executable: str
    git_dir: Path
    work_tree: Path
    index_file: Path

    def environment(self) -> dict[str, str]:
        """No work tree: only `launch(..., workspace_fd=...)` gives git one, inside the sandbox."""
        empty_home = str(self.git_dir / "home")  # never created: nothing to read there
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": empty_home,
            "XDG_CONFIG_HOME": empty_home,
            "LANG": "C",
            "LC_ALL": "C",
            "TZ": "UTC",
            "GIT_DIR": str(self.git_dir),
            "GIT_INDEX_FILE": str(self.index_file),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_LITERAL_PATHSPECS": "1",  # a path is a path, never a glob or :(magic)
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            **IDENTITY,
        }

    def launch(self, *args: str, bare: bool = False, workspace_fd: int | None = None) -> Launch:
        """`git <args>`, with no work tree and "/" as cwd; or, given the workspace root's descriptor (opened
        by `confine.open_root`), sandboxed with that workspace as its work tree (`sandbox_argv`).

        `bare` leaves the git dir and index out (`git init` refuses them). Every git call starts here: never
        inside a database transaction (`threadloom.io_guard`)."""
        io_guard.check("git")
        env = self.environment()
        if bare:
            for name in ("GIT_DIR", "GIT_INDEX_FILE"):
                del env[name]
        if workspace_fd is None:
            return Launch([self.executable, *args], env, "/", ())
        env["PATH"] = SANDBOX_PATH
        env["GIT_WORK_TREE"] = SANDBOX_WORKSPACE
        argv = sandbox_argv(self.executable, workspace_fd, self.git_dir, env, [self.executable, *args])
        return Launch(argv, dict(BWRAP_ENV), "/", (workspace_fd,))

    async def run(
        self,
        *args: str,
        stdin: bytes | None = None,
        check: bool = True,
        bare: bool = False,
        workspace_fd: int | None = None,
    ) -> GitResult:
        """Run `git <args>` (see `launch`); non-zero exit raises GIT_FAILED unless `check` is False."""
        how = self.launch(*args, bare=bare, workspace_fd=workspace_fd)
        process = await subprocesses.create_subprocess_exec(
            *how.argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=how.env,
            cwd=how.cwd,
            pass_fds=how.pass_fds,
            start_new_session=True,  # a cancelled call kills git and all it started (`communicate`)
        )
        stdout, stderr = await subprocesses.communicate(process, stdin, group=True)
        result = GitResult(process.returncode or 0, stdout, stderr)
        if check and result.returncode != 0:
            raise CheckpointError(
                CheckpointErrorCode.GIT_FAILED,
                f"git {args[0]} failed ({result.returncode}): {stderr.decode(errors='replace').strip()[:2000]}",
            )
        return result

    async def text(self, *args: str, stdin: bytes | None = None) -> str:
        """stdout of a successful call, decoded and stripped."""
        return (await self.run(*args, stdin=stdin)).stdout.decode(errors="surrogateescape").strip()

    async def rewrite_index(self, *args: str, stdin: bytes | None = None) -> GitResult:
        """`run` for a call without a work tree that rewrites the index (`update-index --index-info`,
        `write-tree`), with the index file's time put back as it was.

        git trusts an entry's stat data only when the file changed before the second the index was written
        (its seconds, size and inode are all it compares); an entry of that same second is "racy" and gets
        its content compared. Rewriting the index moves its time on, so git smudges the racy entries first,
        but it must look at their files to do so, and a call without a work tree cannot. Without the old time
        back, a file the agent rewrote in that second with the same size would look unchanged from then on,
        to every capture and restore."""
        before = None  # no index yet: no entry has stat data
        with contextlib.suppress(FileNotFoundError):
            before = os.stat(self.index_file, follow_symlinks=False)
        try:
            return await self.run(*args, stdin=stdin)
        finally:
            if before is not None:
                with contextlib.suppress(FileNotFoundError):
                    times = (before.st_atime_ns, before.st_mtime_ns)
                    os.utime(self.index_file, ns=times, follow_symlinks=False)

    async def rewrite_index_text(self, *args: str) -> str:
        """`rewrite_index`'s stdout, decoded and stripped (`write-tree`'s tree id)."""
        return (await self.rewrite_index(*args)).stdout.decode(errors="surrogateescape").strip()


def sandbox_argv(
    executable: str, workspace_fd: int, git_dir: Path, env: dict[str, str], command: list[str]
) -> list[str]:
    """The `bwrap` command line for a git call that reads the workspace (`update-index --add`).

    Inside there is only the workspace (bound from the descriptor `confine.open_root` opened without following
    any link, at `SANDBOX_WORKSPACE`), the shadow git dir (read-write, at its own path: objects and the index
    are written there), `/usr` read-only with the usual links into it, and a minimal `/dev` (git reads
    `/dev/null` as its hooks path and global config). Fresh namespaces, no network, the environment cleared
    to `env`. So a symlink in the workspace, even one swapped in while git runs, resolves only to something
    inside the sandbox: never another project's files, the data dir or the server's install."""
    try:
        bwrap = find_bwrap()
    except SandboxUnavailable as missing:
        raise CheckpointError(CheckpointErrorCode.SANDBOX_UNAVAILABLE, str(missing)) from None
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for link, target in SYSTEM_LINKS:
        args += ["--symlink", target, link]
    real = Path(executable).resolve()
    if not real.is_relative_to("/usr") and len(real.parents) > 2:
        prefix = str(real.parents[1])  # e.g. /opt/git for /opt/git/bin/git: its libexec comes along
        args += ["--ro-bind", prefix, prefix]
    args += ["--dev", "/dev", "--bind-fd", str(workspace_fd), SANDBOX_WORKSPACE]
    args += ["--bind", str(git_dir), str(git_dir), "--chdir", SANDBOX_WORKSPACE, "--clearenv"]
    for name, value in env.items():
        args += ["--setenv", name, value]
    return [*args, "--", *command]

"""Running git against a shadow repository with a controlled environment.

Nothing of the user's git setup may leak in: no system or global config (hooks, filters, aliases,
excludes, attributes), no GIT_* variables inherited from whoever started Threadloom (a GIT_DIR set
by a hook would point every command at the user's repository). Each call gets a fresh, minimal
environment naming the shadow git dir, its private index and the workspace as the work tree.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from threadloom.checkpoints.errors import CheckpointError, CheckpointErrorCode

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
class Git:
    """git bound to one shadow repository and one work tree."""

    executable: str
    git_dir: Path
    work_tree: Path
    index_file: Path

    def environment(self) -> dict[str, str]:
        empty_home = str(self.git_dir / "home")  # never created: nothing to read there
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": empty_home,
            "XDG_CONFIG_HOME": empty_home,
            "LANG": "C",
            "LC_ALL": "C",
            "TZ": "UTC",
            "GIT_DIR": str(self.git_dir),
            "GIT_WORK_TREE": str(self.work_tree),
            "GIT_INDEX_FILE": str(self.index_file),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_LITERAL_PATHSPECS": "1",  # a path is a path, never a glob or :(magic)
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
            **IDENTITY,
        }

    async def run(self, *args: str, stdin: bytes | None = None, check: bool = True, bare: bool = False) -> GitResult:
        """Run `git <args>` in the work tree; non-zero exit raises GIT_FAILED unless `check` is False.

        `bare` leaves the work tree and index out (`git init` refuses them).
        """
        env = self.environment()
        if bare:
            for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
                del env[name]
        elif not self.work_tree.is_dir():
            # History stays readable when the workspace is gone; commands that need the work tree
            # are refused earlier with WORKSPACE_MISSING.
            bare = True
            del env["GIT_WORK_TREE"]
        process = await asyncio.create_subprocess_exec(
            self.executable,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=str(self.git_dir.parent if bare else self.work_tree),
        )
        stdout, stderr = await process.communicate(stdin)
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

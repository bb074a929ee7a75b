"""What a client example installs into its folder, kept outside the clone, one copy per input hash.

Each `client-examples/*/run` installs its packages into its own folder the first time (`npm ci` into the
TypeScript example's node_modules, a venv for the Python one): in a clean clone -- every CI run, every newcomer --
that was ~20 s of CPU. The test restores the folder from a copy made by an earlier run with the same inputs
(the lock or requirements file and the interpreter), linked file by file (`cp -al`, as scripts/agents does for
the agents' node_modules), so `run` finds it installed and skips its install step; when there is no copy yet, `run`
installs as a user's first run does, and the result is kept for the next clone. A copy is only taken from a folder
the run left installed (its stamp matches the inputs), so a failed install is never kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """The folder scripts/deps and scripts/agents keep their caches in."""
    base = os.environ.get("THREADLOOM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "threadloom"
    )
    return Path(base)


@dataclasses.dataclass(frozen=True)
class Installed:
    """`folder` (what `run` installs), current when the file `stamp` in it holds the text of `inputs[0]`."""

    name: str
    folder: Path
    stamp: str
    inputs: tuple[Path, ...]

    def _key(self) -> str:
        digest = hashlib.sha256(sys.version.encode())  # a venv belongs to its interpreter
        for path in self.inputs:
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]

    def _current(self, folder: Path) -> bool:
        try:
            return (folder / self.stamp).read_bytes() == self.inputs[0].read_bytes()
        except OSError:
            return False

    @property
    def cached(self) -> Path:
        return cache_root() / f"{self.name}-{self._key()}"

    def restore(self) -> None:
        """Put the kept copy in place when the folder is not installed already and a copy is kept."""
        if self._current(self.folder) or not self._current(self.cached):
            return
        shutil.rmtree(self.folder, ignore_errors=True)
        if subprocess.run(["cp", "-al", str(self.cached), str(self.folder)], capture_output=True).returncode != 0:
            shutil.rmtree(self.folder, ignore_errors=True)
            shutil.copytree(self.cached, self.folder, symlinks=True)

    def keep(self) -> None:
        """Keep what `run` installed for the next clone (nothing when it is not installed, or already kept)."""
        if not self._current(self.folder) or self._current(self.cached):
            return
        self.cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{self.name}.", dir=self.cached.parent))
        tmp.chmod(0o755)
        copied = subprocess.run(["cp", "-al", f"{self.folder}/.", str(tmp)], capture_output=True).returncode == 0
        if not copied:
            shutil.rmtree(tmp, ignore_errors=True)
            return
        shutil.rmtree(self.cached, ignore_errors=True)
        tmp.rename(self.cached)

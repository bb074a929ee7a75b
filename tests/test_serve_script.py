"""scripts/serve's setup steps do nothing on a machine that has what they install, and say exactly what is
needed when they cannot install it. The real scripts, run in subprocesses with a PATH of the test's own
making: nothing on this machine is installed or changed.

- scripts/system-packages: the commands of every needed package on PATH → silent, and apt-get never run;
  one missing, not root (the real uid 65534 via setpriv) → the exact `sudo apt-get install` line;
  root, with apt-get held by another process's dpkg lock (a stand-in apt-get that answers as apt does then)
  → a bounded number of attempts, then a message naming the holder and the line to run.
- scripts/deps: a stamp that covers the packaging files and the extras asked for → the step is skipped
  (scripts/serve after scripts/test does not reinstall).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PACKAGES = ROOT / "scripts" / "system-packages"
BASH = shutil.which("bash") or "/bin/bash"
AS_NOBODY = ("--reuid", "65534", "--regid", "65534", "--clear-groups", "--")


def bin_with(folder: Path, *commands: str) -> Path:
    """A PATH folder holding only these commands (links to the machine's own)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    for name in commands:
        found = shutil.which(name)
        assert found, f"{name} is needed to run this test"
        (folder / name).symlink_to(found)
    return folder


def stand_in_apt_get(folder: Path, script: str) -> Path:
    """An `apt-get` that logs each call to calls.log and then runs `script` (what the real one would answer)."""
    log = folder / "calls.log"
    (folder / "apt-get").write_text(f'#!{BASH}\necho "$*" >> {log}\n{script}\n')
    (folder / "apt-get").chmod(0o755)
    return log


def test_nothing_is_installed_when_every_command_is_there(tmp_path: Path) -> None:
    path = bin_with(tmp_path / "bin", "bwrap", "socat", "pasta")
    calls = stand_in_apt_get(path, "exit 1")
    done = subprocess.run(
        [BASH, str(SYSTEM_PACKAGES)], env={"PATH": str(path)}, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not calls.exists()  # apt-get not even asked


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs the script as uid 65534")
def test_without_root_it_prints_the_exact_apt_get_line(tmp_path: Path) -> None:
    path = bin_with(tmp_path / "bin", "socat")  # bwrap and pasta missing
    tmp_path.chmod(0o755)
    done = subprocess.run(
        [shutil.which("setpriv") or "setpriv", *AS_NOBODY, BASH, str(SYSTEM_PACKAGES)],
        env={"PATH": str(path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert "system-packages:   sudo apt-get install -y bubblewrap passt" in lines, done.stderr
    assert any("missing bubblewrap (bwrap: the sandbox every agent command runs in" in line for line in lines)
    assert not any("missing socat" in line for line in lines)


@pytest.mark.skipif(os.geteuid() != 0, reason="the retries are root's path")
def test_a_held_dpkg_lock_is_retried_a_bounded_number_of_times_then_explained(tmp_path: Path) -> None:
    path = bin_with(tmp_path / "bin", "socat", "pasta", "grep", "mktemp", "rm", "sleep", "head", "sed", "tail")
    calls = stand_in_apt_get(
        path,
        "echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (unattended-upgr)' >&2"
        "\nexit 100",
    )
    env = {"PATH": str(path), "THREADLOOM_APT_ATTEMPTS": "3", "THREADLOOM_APT_RETRY_SECONDS": "0"}
    done = subprocess.run([BASH, str(SYSTEM_PACKAGES)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    attempts = calls.read_text().splitlines()
    assert len(attempts) == 3 and all("install -y -qq bubblewrap" in call for call in attempts), attempts
    assert all("DPkg::Lock::Timeout=60" in call for call in attempts)  # apt itself waits on the lock first
    assert "busy (lock held by process 4242 (unattended-upgr)); gave up after 3 attempts" in done.stderr
    assert done.stderr.rstrip().endswith("then run: apt-get install -y bubblewrap"), done.stderr


def packaging_digest() -> str:
    """What scripts/deps stamps: the first 16 hex digits of sha256(pyproject.toml + setup.py + its install mode
    line), so a change of either file or of how the project is installed installs again."""
    files = (ROOT / "pyproject.toml").read_bytes() + (ROOT / "setup.py").read_bytes()
    return hashlib.sha256(files + b"editable_mode=compat\n").hexdigest()[:16]


def deps_clone(tmp_path: Path) -> Path:
    """scripts/deps and the packaging files it hashes, in a folder of their own with an (empty) .venv."""
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / ".venv").mkdir()
    shutil.copy2(ROOT / "scripts" / "deps", clone / "scripts" / "deps")
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy2(ROOT / name, clone / name)
    return clone


@pytest.mark.parametrize(("stamped", "asked"), [("test", ""), ("test", "test"), ("-", "")])
def test_deps_is_skipped_when_the_stamp_covers_what_is_asked(tmp_path: Path, stamped: str, asked: str) -> None:
    clone, cache = deps_clone(tmp_path), tmp_path / "cache"
    stamp = f"{packaging_digest()} {stamped}\n"
    (clone / ".venv" / ".threadloom-deps").write_text(stamp)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "THREADLOOM_CACHE": str(cache)}
    argv = [BASH, str(clone / "scripts" / "deps"), *([asked] if asked else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "")
    assert not cache.exists()  # neither uv nor pip was reached
    assert (clone / ".venv" / ".threadloom-deps").read_text() == stamp


@pytest.mark.parametrize(("stamp", "asked"), [("{digest} -", "test"), ("0000000000000000 test", "")])
def test_deps_installs_when_the_stamp_does_not_cover_what_is_asked(tmp_path: Path, stamp: str, asked: str) -> None:
    """The other side: extras not yet installed, or changed packaging files, reach the installer (here it
    fails at once: there is no Python on this PATH and no .venv to install into)."""
    clone, cache = deps_clone(tmp_path), tmp_path / "cache"
    (clone / ".venv" / ".threadloom-deps").write_text(stamp.format(digest=packaging_digest()) + "\n")
    path = bin_with(tmp_path / "bin", "dirname", "cat", "sha256sum", "cut", "mkdir", "mktemp", "rm")
    env = {"PATH": str(path), "HOME": str(tmp_path), "THREADLOOM_CACHE": str(cache)}
    argv = [BASH, str(clone / "scripts" / "deps"), *([asked] if asked else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert cache.exists()  # it went for the installer

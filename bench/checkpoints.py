"""Checkpoint capture and restore on a big workspace with a few changed files.

A workspace of N files (default 10,000 in 100 folders, 100 MB in all) gets a baseline checkpoint;
then each round changes 10 files (appends to 9, adds 1), captures a checkpoint and restores the
previous one. Two floors are measured in the same run on the same disk:

- git: the same edits in a plain git repository holding a copy of the workspace, timed as
  `git add -A && git commit` (capture) and `git reset --hard HEAD~1` (restore);
- copy: a raw copy of the whole tree (`cp -a`), what a checkpoint without an index would do.

    .venv/bin/python bench/checkpoints.py [--files 10000] [--megabytes 100] [--rounds 7] [--smoke]

`--smoke` uses 200 files / 2 MB and 3 rounds (seconds, for tests/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from common import bench_tmp  # noqa: E402

from threadloom.checkpoints import CheckpointStore, checkpoint_ref  # noqa: E402

CHANGED = 10

GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


def build_workspace(root: Path, files: int, total_bytes: int, rng: random.Random) -> list[Path]:
    """`files` files of about equal size in folders of 100; text-like content (compressible)."""
    words = [rng.randbytes(rng.randint(2, 9)).hex().encode() for _ in range(4000)]
    size = max(1, total_bytes // files)
    made = []
    for i in range(files):
        folder = root / f"pkg{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        chunks: list[bytes] = []
        length = 0
        while length < size:
            line = b" ".join(rng.choices(words, k=12)) + b"\n"
            chunks.append(line)
            length += len(line)
        path = folder / f"file{i:05d}.txt"
        path.write_bytes(b"".join(chunks)[:size])
        made.append(path)
    return made


def edit(root: Path, relative: list[str], round_no: int) -> None:
    """Append to all but the last path, create the last (an agent's typical few edits)."""
    for rel in relative[:-1]:
        with open(root / rel, "ab") as handle:
            handle.write(f"edit in round {round_no}\n".encode())
    (root / relative[-1]).write_text(f"new file of round {round_no}\n")


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, stdout=subprocess.DEVNULL)


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def copy_tree(source: Path, target: Path) -> None:
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)


def remove_tree(target: Path) -> None:
    subprocess.run(["rm", "-rf", str(target)], check=True)


def report(name: str, ours: list[float], git_floor: list[float], copy_floor: list[float]) -> None:
    mine, floor_git, floor_copy = (statistics.median(x) for x in (ours, git_floor, copy_floor))
    print(f"{name}: median {mine * 1000:8.1f} ms  (min {min(ours) * 1000:.1f}, max {max(ours) * 1000:.1f})")
    print(f"  floor git:  median {floor_git * 1000:8.1f} ms")
    print(f"  floor copy: median {floor_copy * 1000:8.1f} ms")
    print(f"  ratio {mine / floor_git:.2f}x vs git, {mine / floor_copy:.2f}x vs copy")


def main(files: int, megabytes: float, rounds: int) -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    rng = random.Random(14)
    with bench_tmp("threadloom-bench-checkpoints-") as tmp:
        workspace = tmp / "workspace"
        made = build_workspace(workspace, files, int(megabytes * 1024 * 1024), rng)
        plain = tmp / "plain-git"
        copy_tree(workspace, plain)
        git(plain, "init", "-q")
        git_first = timed(lambda: (git(plain, "add", "-A"), git(plain, "commit", "-q", "-m", "baseline")))

        store = CheckpointStore(tmp / "data")
        repo = store.repo("bench", workspace)
        first = timed(lambda: loop.run_until_complete(repo.capture(checkpoint_ref("t", "root", 0), "baseline")))
        previous = loop.run_until_complete(repo.capture(checkpoint_ref("t", "root", 1), "warm"))
        size = sum(p.stat().st_size for p in made) / 1024 / 1024
        print(f"workspace: {files} files, {size:.0f} MB")
        print(f"first capture (hashes everything): {first * 1000:.0f} ms")
        print(f"  floor git first add+commit: {git_first * 1000:.0f} ms")

        captures: list[float] = []
        restores: list[float] = []
        git_commits: list[float] = []
        git_resets: list[float] = []
        copies: list[float] = []
        unchanged: list[float] = []
        for round_no in range(rounds):
            changed = [p.relative_to(workspace).as_posix() for p in rng.sample(made, CHANGED - 1)]
            changed.append(f"pkg000/new-{round_no}.txt")
            edit(workspace, changed, round_no)
            edit(plain, changed, round_no)

            ref = checkpoint_ref("t", "root", round_no + 2)
            start = time.perf_counter()
            capture = loop.run_until_complete(repo.capture(ref, f"round {round_no}", parent=previous.commit))
            captures.append(time.perf_counter() - start)
            changes = loop.run_until_complete(repo.diff(previous.commit, capture.commit))
            assert len(changes) == CHANGED, changes
            start = time.perf_counter()
            loop.run_until_complete(repo.capture(ref, "again, nothing changed", parent=capture.commit))
            unchanged.append(time.perf_counter() - start)

            git_commits.append(timed(lambda: (git(plain, "add", "-A"), git(plain, "commit", "-q", "-m", "round"))))
            copies.append(timed(lambda: copy_tree(workspace, tmp / "copy")))
            remove_tree(tmp / "copy")

            start = time.perf_counter()
            restored = loop.run_until_complete(repo.restore(previous.commit))
            restores.append(time.perf_counter() - start)
            assert len(restored.written) + len(restored.removed) == CHANGED, restored
            git_resets.append(timed(lambda: git(plain, "reset", "-q", "--hard", "HEAD~1")))

        print(f"{CHANGED} changed files per round, {rounds} rounds")
        report("capture", captures, git_commits, copies)
        report("restore", restores, git_resets, copies)
        print(f"capture with nothing changed: median {statistics.median(unchanged) * 1000:.1f} ms")
    loop.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--megabytes", type=float, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="200 files / 2 MB, 3 rounds")
    options = parser.parse_args()
    if options.smoke:
        main(200, 2, 3)
    else:
        main(options.files, options.megabytes, options.rounds)

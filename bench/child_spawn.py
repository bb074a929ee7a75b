"""What starting a child costs the server: `threadloom.subprocesses.create_subprocess_exec` on uvloop.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/child_spawn.py [--children 300] [--heap-mb 200] [--smoke]

The server starts git for every checkpoint and restore and a sandbox for every agent, from a process whose
heap is hundreds of megabytes. Each side runs in a fresh process holding a heap of `--heap-mb` (touched, as a
server's is) and starts `/bin/true` `--children` times one after another, waiting for each: wall time per
child and CPU per child (the process's own plus the children's, from `getrusage`: `os.times` counts in clock ticks of
10 ms, and 20 children of the smoke run could read as no CPU at all). The floor, measured in the
same run, is asyncio's own `create_subprocess_exec` on the standard loop (`subprocess.Popen`, which uses
vfork). Beside it: uvloop's own `create_subprocess_exec` (libuv's fork), what the server used before.

`--smoke` starts 20 children with a 20 MB heap per side (seconds, for tests/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIDES = {
    "floor": "asyncio's create_subprocess_exec on the standard loop (vfork)",
    "threadloom": "threadloom.subprocesses.create_subprocess_exec on uvloop (vfork)",
    "uvloop": "uvloop's own create_subprocess_exec (fork), before",
}


def measure(side: str, children: int, heap_mb: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per child, in this process (run once per side, in a fresh one)."""
    heap = [bytearray(1 << 20) for _ in range(heap_mb)]
    for block in heap:
        block[::4096] = b"x" * len(block[::4096])  # touch every page, as a server's heap is
    objects = [str(i) for i in range(heap_mb * 5000)]  # and objects whose refcounts a fork's child may touch
    if side == "floor":
        loop_factory = asyncio.SelectorEventLoop
        spawn = asyncio.create_subprocess_exec
    else:
        import uvloop

        from threadloom import subprocesses

        loop_factory = uvloop.new_event_loop
        spawn = subprocesses.create_subprocess_exec if side == "threadloom" else asyncio.create_subprocess_exec

    async def run() -> None:
        for _ in range(children):
            child = await spawn("/bin/true", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            await child.communicate()
            assert child.returncode == 0, child.returncode

    before, started = _cpu(), time.perf_counter()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run())
    wall, cpu = time.perf_counter() - started, _cpu() - before
    del heap, objects
    return wall / children * 1000, cpu / children * 1000


def _cpu() -> float:
    """User and system CPU seconds of this process and its reaped children (microsecond resolution)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--children", type=int, default=300)
    parser.add_argument("--heap-mb", type=int, default=200)
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # one side, in a child process
    parser.add_argument("--smoke", action="store_true", help="20 children, a 20 MB heap (for the tests)")
    args = parser.parse_args()
    if args.smoke:
        args.children, args.heap_mb = 20, 20
    if args.side:
        wall, cpu = measure(args.side, args.children, args.heap_mb)
        print(f"{wall} {cpu}")
        return 0
    print(f"{args.children} children of /bin/true, one after another, from a process with a {args.heap_mb} MB heap")
    results = {}
    for side in SIDES:
        argv = [sys.executable, __file__, "--side", side, "--children", str(args.children)]
        done = subprocess.run([*argv, "--heap-mb", str(args.heap_mb)], capture_output=True, text=True, check=True)
        wall, cpu = map(float, done.stdout.split())
        results[side] = (wall, cpu)
        print(f"  {side:<10} {wall:6.2f} ms  CPU {cpu:6.2f} ms per child   {SIDES[side]}")
    floor, ours, before = results["floor"], results["threadloom"], results["uvloop"]
    print(f"  ratio      {ours[0] / floor[0]:.2f}x wall, {ours[1] / floor[1]:.2f}x CPU (threadloom over the floor)")
    print(f"  before     {before[0] / floor[0]:.2f}x wall, {before[1] / floor[1]:.2f}x CPU (uvloop's fork)")
    return 0


if __name__ == "__main__":
    sys.path[:0] = [str(REPO / "src")]
    raise SystemExit(main())

"""The per-test CPU the times file records (tests/support/tree_cpu.py) counts a detached grandchild's CPU.

That is its point: PostgreSQL and the forkserver detach from the worker that started them, so neither the
process tree nor `RUSAGE_CHILDREN` sees them. Run in a process of its own, so the group it makes is its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import tree_cpu

PROBE = """
import json, os, resource, subprocess, sys, time
from tests.support import tree_cpu
cpu = tree_cpu.enter()
if cpu is None:
    print(json.dumps(None)); sys.exit(0)
burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass"
# A grandchild that outlives its parent (as PostgreSQL does its pg_ctl): this process never waits for it.
detach = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {burn!r}], start_new_session=True)"
subprocess.run([sys.executable, "-c", detach])
deadline = time.monotonic() + 30
while cpu.total() < 0.4 and time.monotonic() < deadline:
    time.sleep(0.05)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"group": cpu.total(), "children": children.ru_utime + children.ru_stime}))
cpu.leave()
"""


def test_the_group_counts_a_detached_grandchilds_cpu_that_rusage_misses() -> None:
    if not (tree_cpu.V1 / "cpuacct.usage").exists() and not (tree_cpu.V2 / "cpu.stat").exists():
        pytest.skip("no cgroup hierarchy to measure with")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=root, capture_output=True, text=True, timeout=60, check=True
    )
    found = json.loads(done.stdout)
    if found is None:
        pytest.skip("this machine lets no test make a control group (not root, or the hierarchy is read-only)")
    assert found["group"] >= 0.4, found  # the grandchild's 0.4 s, though nobody waited for it
    assert found["children"] < 0.4, found  # what the process tree reports: its child only, which burned nothing

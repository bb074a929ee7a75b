"""The CPU a test process and everything it started used: its PostgreSQL, servers, agents and CLIs.

A worker's processes outlive their parent links (PostgreSQL and the forkserver detach), so walking the process
tree misses them; a control group does not: a process stays in its parent's group whatever it does after the
fork. With THREADLOOM_TEST_TIMES set, each worker moves itself into a group of its own (root, with the cgroup v1
`cpuacct` hierarchy or cgroup v2 mounted writable) and each phase recorded in the times file carries `cpu`, the
group's CPU seconds since the phase before ended. Where no group can be made, nothing is recorded and nothing
else changes. `python -m tests.support.slow_files --cpu FILE` then shows which files burn CPU and which wait.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")


class TreeCpu:
    def __init__(self, group: Path, v2: bool) -> None:
        self.group = group
        self.v2 = v2
        self.last = self.total()

    def total(self) -> float:
        """CPU seconds the group used since it was made."""
        if self.v2:
            for line in (self.group / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
            return 0.0
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    def since_last(self) -> float:
        now = self.total()
        used, self.last = now - self.last, now
        return used

    def leave(self) -> None:
        """Back to the parent group. The group goes now if empty, else (a process of the run still ending) at the
        next run's `enter`."""
        with contextlib.suppress(OSError):
            (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()


def enter() -> TreeCpu | None:
    """This process in a group of its own (its children to come with it), or None where that is not possible."""
    if os.geteuid() != 0:
        return None
    name = f"threadloom-tests-{os.getpid()}"
    for root, v2 in ((V1, False), (V2, True)):
        probe = root / ("cpu.stat" if v2 else "cpuacct.usage")
        if not probe.exists():
            continue
        for stale in root.glob("threadloom-tests-*"):  # left by earlier runs: removable once empty
            with contextlib.suppress(OSError):
                stale.rmdir()
        group = root / name
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
            return TreeCpu(group, v2)
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
    return None

"""How `./scripts/test` hands test files to its two xdist workers: the longest first, the long ones split.

`--dist loadfile` keeps a test module on one worker (a module-scoped server is started once), and xdist
hands the modules out by how many tests they have. The suite's time is not in its counts: a file of three
slow-consumer tests took longer than one of three hundred pure rules, and a long file handed out last pins
one worker while the other has finished. So conftest's `pytest_xdist_make_scheduler` makes this scheduler
for `--dist loadfile`:

- units are handed out longest first (the times in tests/support/slow_files.py; a file not listed there is
  counted as `slow_files.UNLISTED_PER_TEST` seconds a test up to `UNLISTED_CAP`, so a new file is started
  early rather than late);
- a long file (`slow_files.SPLIT_ABOVE` seconds or more) whose source defines no fixture shared across its
  tests (no `scope="module"`, `"class"` or `"package"`, and no `SHARED_SERVER = True`) is split into one
  unit per test: its tests share nothing but the session's PostgreSQL and the spare server, which every
  worker has, so both workers can take them. A file that shares a module-scoped server or scene stays one
  unit (split, each worker would start the module's server again whenever it came back to the file).

Which tests run, and with what, is unchanged: only the order and the worker differ.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, OrderedDict
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

from tests.support import slow_files

SHARED_FIXTURE = re.compile(r"""scope\s*=\s*["'](module|class|package)["']|^SHARED_SERVER\s*=\s*True""", re.M)


@functools.cache
def splittable(rootdir: Path, file: str) -> bool:
    """Whether `file` (a path from the root, as in node ids) is long and shares no fixture between tests."""
    if slow_files.SECONDS.get(file, 0.0) < slow_files.SPLIT_ABOVE or file in slow_files.KEEP_WHOLE:
        return False
    try:
        return SHARED_FIXTURE.search((rootdir / file).read_text()) is None
    except OSError:
        return False


def cost(scope: str, tests: int, in_file: int) -> float:
    """The expected seconds of a unit of `tests` tests: a whole file, or one test of a split file of
    `in_file` tests."""
    file, _, test = scope.partition("::")
    listed = slow_files.SECONDS.get(file)
    if listed is None:
        return min(tests * slow_files.UNLISTED_PER_TEST, slow_files.UNLISTED_CAP)
    if test:
        return slow_files.TESTS.get(scope, listed / in_file)
    return listed


class LongestFirst(LoadFileScheduling):
    """`--dist loadfile` with long files split per test and the units handed out longest first."""

    def __init__(self, config: pytest.Config, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self.rootdir = Path(str(config.rootpath))
        self.ordered = False

    def _split_scope(self, nodeid: str) -> str:
        file = nodeid.split("::", 1)[0]
        return nodeid if splittable(self.rootdir, file) else file

    def _assign_work_unit(self, node: object) -> None:
        if not self.ordered:  # the work queue is complete when the first unit is handed out
            self.ordered = True
            in_file = Counter(nodeid.split("::", 1)[0] for unit in self.workqueue.values() for nodeid in unit)

            def expected(unit: tuple[str, dict[str, bool]]) -> float:
                return cost(unit[0], len(unit[1]), in_file[unit[0].split("::", 1)[0]])

            units = sorted(self.workqueue.items(), key=expected, reverse=True)  # stable: ties keep their order
            self.workqueue = OrderedDict(units)
        super()._assign_work_unit(node)  # type: ignore[arg-type]

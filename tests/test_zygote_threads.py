"""Commands forked by tests/support/zygote.py from several threads at once each report their own exit status.

`test_cli_errors.py` runs its table's invocations from four threads. multiprocessing's `Process` is not
thread-safe there: each `start()` polls every other live child, and a forkserver child's status is a number
read once from a pipe, so a start racing a wait could read it first and leave the waiting thread an empty pipe,
which multiprocessing reports as exit status 255 (seen once in a full run: the CLI had printed its coded line).
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

from tests.support import zygote

RUNS = 60


def test_commands_forked_from_threads_at_once_each_report_their_own_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")

    def one(i: int) -> int:
        return zygote.run([str(script), str(3 + i % 5)], dict(os.environ), timeout=60, script=True).returncode

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(one, range(RUNS)))
    assert codes == [3 + i % 5 for i in range(RUNS)]

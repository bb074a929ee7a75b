"""Every benchmark in bench/ still runs: each with `--smoke` (tiny sizes, seconds) in a process of its own,
forked from the test process's preloaded forkserver (tests/support/zygote.py) rather than started, which
skips about a second of imports a benchmark.

The figures mean nothing at these sizes; the test only proves that the benchmark's code
still matches the engine (a benchmark nobody runs rots) and that it still measures its
floor and prints the ratio against it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support import zygote
from tests.support.pg import PgServer

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = [
    "run_throughput.py",
    "query_page.py",
    "replay.py",
    "fanout.py",
    "agent_turns.py",
    "checkpoints.py",
    "ingest_fairness.py",
    "spread.py",
    "metrics_overhead.py",
    "acp_prompts.py",
    "acp_turns.py",
    "validation_worst.py",
    "child_spawn.py",
]
RATIO = re.compile(r"^\s*ratio\s+(median\s+)?[0-9.]+x", re.MULTILINE)


def test_every_benchmark_is_smoked() -> None:
    """A new benchmark (a script with a `main`) is added to BENCHMARKS, so it is smoked too."""
    scripts = {p.name for p in (ROOT / "bench").glob("*.py") if "__main__" in p.read_text()}
    assert scripts == set(BENCHMARKS)


@pytest.mark.slow
@pytest.mark.parametrize("script", BENCHMARKS)
def test_each_benchmark_smoke_run_prints_its_ratio(script: str, pg: PgServer) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["THREADLOOM_BENCH_PG"] = str(pg.root)  # the session's PostgreSQL, not one started per benchmark
    done = zygote.run([str(ROOT / "bench" / script), "--smoke"], env, cwd=str(ROOT), timeout=180, script=True)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert "floor" in done.stdout, done.stdout
    assert RATIO.search(done.stdout), f"{script} printed no ratio line:\n{done.stdout[-3000:]}"

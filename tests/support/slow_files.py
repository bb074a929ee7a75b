"""How long each test file takes: the order tests/support/schedule.py hands files to the workers in.

Only the order matters (longest first), not the figures themselves, so the table is kept coarse and is
refreshed now and then, not on every change:

    THREADLOOM_TEST_TIMES=/tmp/times.jsonl ./scripts/test -q
    .venv/bin/python -m tests.support.slow_files /tmp/times.jsonl > /tmp/table.py   # then paste it below

A file missing from the table (a new one) counts `UNLISTED_PER_TEST` seconds a test, so it is handed out
early rather than last: a long file handed out last is what keeps one worker busy while the other is done.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

# A file not in SECONDS: this many seconds per test (most server tests take 2-5 s), at most UNLISTED_CAP.
UNLISTED_PER_TEST = 5.0
UNLISTED_CAP = 60.0
# A file expected to take this long or more is split into one unit per test when it shares no fixture.
SPLIT_ABOVE = 25.0
# Long files never split though they define no shared fixture (none today).
KEEP_WHOLE: frozenset[str] = frozenset()

# Seconds per file (setup, call and teardown of its tests summed). Measured on the shared 2-core machine under
# other engineers' load (scaled to a quiet run), the rest from a quiet run's slowest tests and docs/testing.md.
SECONDS: dict[str, float] = {
    "tests/test_dashboard_browser.py": 121,
    "tests/test_bench_smoke.py": 110,
    "tests/test_rollback_crash.py": 103,
    "tests/test_fuzz.py": 80,
    "tests/test_security_fork_folders.py": 79,
    "tests/test_graph_links.py": 70,
    "tests/test_security_agents.py": 68,
    "tests/test_forks.py": 64,
    "tests/test_security_tokens.py": 61,
    "tests/test_streams.py": 57,
    "tests/test_claude_driver.py": 45,
    "tests/test_metrics.py": 45,
    "tests/test_runs.py": 45,
    "tests/test_lineage_activities.py": 43,
    "tests/test_requests.py": 42,
    "tests/test_client_examples.py": 40,
    "tests/test_streams_limits.py": 40,
    "tests/test_replicas.py": 40,
    "tests/test_barrier_served.py": 40,
    "tests/test_graph_links_handoffs.py": 5,
    "tests/test_graph_links_events.py": 5,
    "tests/test_thread_races.py": 40,
    "tests/test_security_review_agents.py": 40,
    "tests/test_security_agent_user.py": 40,
    "tests/test_security_api.py": 39,
    "tests/test_security_workspace_api.py": 39,
    "tests/test_management.py": 35,
    "tests/test_rollback_cli.py": 35,
    "tests/test_rollback_shared_workspace.py": 35,
    "tests/test_runtime_mode_input.py": 33,
    "tests/test_streams_bytes.py": 30,
    "tests/test_operations.py": 30,
    "tests/test_agents_e2e.py": 29,
    "tests/test_switching.py": 29,
    "tests/test_rollback.py": 29,
    "tests/test_bad_input.py": 25,
    "tests/test_codex_driver.py": 25,
    "tests/test_packaging.py": 25,
    "tests/test_streams_memory.py": 25,
    "tests/test_handoff_context_cli.py": 25,
    "tests/test_embedded_lifecycle.py": 25,
    "tests/test_checkpoints.py": 25,
    "tests/test_steering.py": 23,
    "tests/test_enum_arguments.py": 23,
    "tests/test_recovery_load.py": 20,
    "tests/test_dispatch_rules.py": 20,
    "tests/test_settings_compat_agents.py": 20,
    "tests/test_bad_input_typed.py": 18,
    "tests/test_security_review_api.py": 15,
    "tests/test_redaction.py": 13,
    "tests/test_api_correctness.py": 11,
    "tests/test_validation_limits.py": 11,
    "tests/test_scripted_agent.py": 10,
    "tests/test_schema_contract.py": 9,
    "tests/test_live_views.py": 9,
    "tests/test_workspace_confinement.py": 9,
    "tests/test_model_faults.py": 9,
    "tests/test_acp.py": 4,
    "tests/test_security_full_access_net.py": 2,
    "tests/test_checkpoint_store.py": 2,
    "tests/test_fast_paths_queries.py": 1,
    # under a second
    "tests/test_barrier_rules.py": 1,
    "tests/test_dashboard_rules.py": 1,
    "tests/test_domain.py": 1,
    "tests/test_effect_payloads.py": 1,
    "tests/test_forks_frozen_rules.py": 1,
    "tests/test_graph_links_vocab.py": 1,
    "tests/test_http_errors.py": 1,
    "tests/test_live_views_rules.py": 1,
    "tests/test_management_rules.py": 1,
    "tests/test_restart_recovery_rules.py": 1,
    "tests/test_retry_run_rules.py": 1,
    "tests/test_rules_acp.py": 1,
    "tests/test_rules_barrier.py": 1,
    "tests/test_rules_dispatch.py": 1,
    "tests/test_rules_forks.py": 1,
    "tests/test_rules_handoffs.py": 1,
    "tests/test_rules_interruption.py": 1,
    "tests/test_rules_queue.py": 1,
    "tests/test_rules_recovery.py": 1,
    "tests/test_rules_rollback.py": 1,
    "tests/test_rules_rollback_ops.py": 1,
    "tests/test_rules_switching.py": 1,
    "tests/test_rules_workspace_rollback.py": 1,
    "tests/test_security_units.py": 1,
    "tests/test_serve_script.py": 1,
    "tests/test_settings_compat_rules.py": 1,
    "tests/test_subagent_nodes_rules.py": 1,
}

# Tests of split files that take much more than their file's average (seconds).
TESTS: dict[str, float] = {
    "tests/test_bench_smoke.py::test_each_benchmark_smoke_run_prints_its_ratio[spread.py]": 18,
    "tests/test_bench_smoke.py::test_each_benchmark_smoke_run_prints_its_ratio[fanout.py]": 18,
    "tests/test_bench_smoke.py::test_each_benchmark_smoke_run_prints_its_ratio[acp_prompts.py]": 11,
    "tests/test_bench_smoke.py::test_each_benchmark_smoke_run_prints_its_ratio[agent_turns.py]": 10,
    "tests/test_client_examples.py::test_example_runs_against_a_real_server[typescript]": 18,
}


def record(path: str, report: Any) -> None:
    """Append one phase of one test (`report`, a pytest TestReport) to the JSON-lines file at `path`."""
    entry = {"id": report.nodeid, "when": report.when, "s": round(report.duration, 3), "outcome": report.outcome}
    line = json.dumps(entry)
    with open(path, "a") as out:
        out.write(line + "\n")


def table(path: Path) -> str:
    """The SECONDS and TESTS tables of a THREADLOOM_TEST_TIMES file, as Python to paste above (TESTS: the
    tests of split files that take at least twice their file's average)."""
    from tests.support.schedule import splittable  # it imports this module
    files: collections.Counter[str] = collections.Counter()
    tests: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        files[entry["id"].split("::", 1)[0]] += entry["s"]
        tests[entry["id"]] += entry["s"]
    count = collections.Counter(test.split("::", 1)[0] for test in tests)
    out = ["SECONDS: dict[str, float] = {"]
    out += [f'    "{file}": {seconds:.0f},' for file, seconds in files.most_common() if seconds >= 1]
    out += ["}", "", "TESTS: dict[str, float] = {"]
    for test, seconds in tests.most_common():
        file = test.split("::", 1)[0]
        if seconds >= 2 * files[file] / count[file] and seconds >= 5 and splittable(Path.cwd(), file):
            out.append(f'    "{test}": {seconds:.0f},')
    out.append("}")
    return "\n".join(out)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))

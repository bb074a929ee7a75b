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
import os
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

# Seconds per file (setup, call and teardown of its tests summed), from a quiet full run on the 2-core machine
# (2026-12-03, 2,379 tests, pytest 13 min 0 s on a machine ~30% slower than the one of the earlier table).
SECONDS: dict[str, float] = {
    "tests/test_fuzz.py": 77,
    "tests/test_dashboard_browser.py": 66,
    "tests/test_bench_smoke.py": 65,
    "tests/test_acp_real_agents_served.py": 46,
    "tests/test_claude_driver.py": 42,
    "tests/test_client_examples.py": 38,
    "tests/test_agents_e2e.py": 37,
    "tests/test_security_tokens.py": 34,
    "tests/test_embedded_lifecycle.py": 29,
    "tests/test_model_faults.py": 28,
    "tests/test_thread_races.py": 28,
    "tests/test_replicas.py": 28,
    "tests/test_rollback.py": 27,
    "tests/test_security_workspace_api.py": 24,
    "tests/test_recovery_load.py": 23,
    "tests/test_rollback_crash.py": 23,
    "tests/test_acp_driver.py": 22,
    "tests/test_streams_memory.py": 22,
    "tests/test_operations.py": 22,
    "tests/test_packaging.py": 21,
    "tests/test_rollback_cli.py": 21,
    "tests/test_faults_postgres.py": 20,
    "tests/test_security_agent_reach.py": 20,
    "tests/test_transfers_agents.py": 18,
    "tests/test_graph_links.py": 18,
    "tests/test_acp_real_agents.py": 16,
    "tests/test_codex_driver.py": 16,
    "tests/test_barrier_served.py": 15,
    "tests/test_webhooks.py": 15,
    "tests/test_redaction_probe.py": 14,
    "tests/test_forks.py": 13,
    "tests/test_acp_bridge_extensions.py": 13,
    "tests/test_security_api.py": 12,
    "tests/test_acp.py": 12,
    "tests/test_steering.py": 12,
    "tests/test_codex_collab_nodes.py": 12,
    "tests/test_usage_ledger.py": 12,
    "tests/test_settings_compat_agents.py": 12,
    "tests/test_metrics.py": 11,
    "tests/test_rollback_across_providers.py": 11,
    "tests/test_security_fork_folders.py": 11,
    "tests/test_restart_recovery_agents.py": 11,
    "tests/test_streams_bytes_http.py": 10,
    "tests/test_graphiql_browser.py": 10,
    "tests/test_delegation.py": 10,
    "tests/test_streams_multi.py": 10,
    "tests/test_validation_process.py": 10,
    "tests/test_concurrency.py": 10,
    "tests/test_streams_bytes.py": 10,
    "tests/test_rollback_agents.py": 10,
    "tests/test_requests.py": 9,
    "tests/test_security_review_api.py": 9,
    "tests/test_fork_workspace.py": 9,
    "tests/test_security_agents.py": 9,
    "tests/test_restart_recovery.py": 9,
    "tests/test_live_views.py": 9,
    "tests/test_streams.py": 9,
    "tests/test_fast_paths_streams.py": 9,
    "tests/test_retries.py": 9,
    "tests/test_forks_frozen.py": 9,
    "tests/test_rollback_shared_workspace.py": 9,
    "tests/test_handoff_context_cli.py": 8,
    "tests/test_enum_arguments.py": 8,
    "tests/test_runs.py": 8,
    "tests/test_faults_redis.py": 8,
    "tests/test_budgets.py": 8,
    "tests/test_security_review_agents.py": 8,
    "tests/test_security_agent_user.py": 8,
    "tests/test_checkpoints.py": 7,
    "tests/test_switching.py": 7,
    "tests/test_multipart.py": 7,
    "tests/test_project_excludes.py": 7,
    "tests/test_cli_finds_server.py": 7,
    "tests/test_schema_contract.py": 7,
    "tests/test_cli_errors.py": 6,
    "tests/test_queries.py": 6,
    "tests/test_stop_cascade_cli.py": 6,
    "tests/test_http_sse.py": 6,
    "tests/test_retry_run.py": 6,
    "tests/test_lineage_activities.py": 6,
    "tests/test_scripted_agent.py": 6,
    "tests/test_run_invariants.py": 6,
    "tests/test_recovery_lost_turn_cli.py": 5,
    "tests/test_usage_agents.py": 5,
    "tests/test_dispatch_rules.py": 5,
    "tests/test_security_full_access_net.py": 5,
    "tests/test_subagent_nodes.py": 5,
    "tests/test_streams_limits.py": 5,
    "tests/test_auth.py": 5,
    "tests/test_no_io_in_transactions.py": 5,
    "tests/test_upgrade_old_database.py": 5,
    "tests/test_chaos.py": 5,
    "tests/test_rollback_pending_handoff.py": 4,
    "tests/test_handoff_context.py": 4,
    "tests/test_scripted_agent_acp.py": 4,
    "tests/test_subagent_nodes_cli.py": 4,
    "tests/test_management.py": 4,
    "tests/test_redaction.py": 4,
    "tests/test_leases.py": 4,
    "tests/test_acp_runtime.py": 4,
    "tests/test_fast_paths_queries.py": 4,
    "tests/test_settings_compat.py": 4,
    "tests/test_acp_chain.py": 4,
    "tests/test_node_lookup.py": 3,
    "tests/test_validation_limits.py": 3,
    "tests/test_graph_docs_queries.py": 3,
    "tests/test_checkpoint_store.py": 3,
    "tests/test_usage_restart.py": 3,
    "tests/test_api_correctness.py": 3,
    "tests/test_codex_collab.py": 3,
    "tests/test_rollback_twice_native.py": 3,
    "tests/test_workspace_confinement.py": 3,
    "tests/test_export_schema.py": 3,
    "tests/test_handoff_facts.py": 3,
    "tests/test_steer_late_codex.py": 3,
    "tests/test_graph_links_handoffs.py": 3,
    "tests/test_worker_lock.py": 2,
    "tests/test_graceful_shutdown.py": 2,
    "tests/test_security_agent_user_cli.py": 2,
    "tests/test_merge_back_lock_order.py": 2,
    "tests/test_webhooks_crash.py": 2,
    "tests/test_bad_input_typed.py": 2,
    "tests/test_plans.py": 2,
    "tests/test_leases_replicas.py": 2,
    "tests/test_cli_acp_url.py": 2,
    "tests/test_acp_leases.py": 2,
    "tests/test_live_views_cost.py": 2,
    "tests/test_providers.py": 2,
    "tests/test_runtime_mode_input.py": 1,
    "tests/test_test_names.py": 1,
    "tests/test_stop_session_shared_runtime.py": 1,
    "tests/test_sessions_idle.py": 1,
    "tests/test_query_snapshot.py": 1,
    "tests/test_bad_input.py": 1,
    "tests/test_graph_links_events.py": 1,
    "tests/test_subscription_starts.py": 1,
    "tests/test_traces.py": 1,
    "tests/test_security_agent_state_files.py": 1,
}

TESTS: dict[str, float] = {
    "tests/test_client_examples.py::test_example_runs_against_a_real_server[typescript]": 20,
    "tests/test_thread_races.py::test_raced_structural_operations_leave_one_consistent_thread[three-providers]": 15,
    "tests/test_bench_smoke.py::test_each_benchmark_smoke_run_prints_its_ratio[fanout.py]": 11,
    "tests/test_bench_smoke.py::test_each_benchmark_smoke_run_prints_its_ratio[spread.py]": 10,
    "tests/test_bench_smoke.py::test_each_benchmark_smoke_run_prints_its_ratio[agent_turns.py]": 10,
}


def record(path: str, report: Any, cpu: float | None = None) -> None:
    """Append one phase of one test (`report`, a pytest TestReport) to the JSON-lines file at `path`; `start`
    (epoch seconds) and `worker` place it on the run's timeline, next to what the machine was doing then;
    `cpu`, when measured, is what the test process and all it started used (tests/support/tree_cpu.py)."""
    entry = {"id": report.nodeid, "when": report.when, "s": round(report.duration, 3), "outcome": report.outcome}
    entry.update(start=round(report.start, 3), worker=os.environ.get("PYTEST_XDIST_WORKER", "main"))
    if cpu is not None:
        entry["cpu"] = round(cpu, 3)
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


def cpu_table(path: Path, top: int = 25) -> str:
    """Per file of a THREADLOOM_TEST_TIMES file recorded with `cpu`: wall seconds, CPU seconds of the worker's
    whole process tree, and the wait (wall minus CPU) -- the files that burn CPU, then those that sit waiting
    (a timer, a poll, a timeout), the first place to look when a run gets slower."""
    wall: collections.Counter[str] = collections.Counter()
    cpu: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        file = entry["id"].split("::", 1)[0]
        wall[file] += entry["s"]
        cpu[file] += entry.get("cpu", 0.0)
    if not cpu:
        return "no CPU recorded (it needs root and a writable cgroup hierarchy: tests/support/tree_cpu.py)"
    out = [f"all files: wall {sum(wall.values()):.0f} s, CPU {sum(cpu.values()):.0f} s", "", "most CPU:"]
    out += [f"  {cpu[f]:7.1f} CPU {wall[f]:7.1f} wall  {f}" for f, _ in cpu.most_common(top)]
    waits = sorted(wall, key=lambda f: cpu[f] - wall[f])[:top]
    out += ["", "most waiting (wall - CPU):"]
    out += [f"  {wall[f] - cpu[f]:7.1f} wait {wall[f]:7.1f} wall  {f}" for f in waits]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1] == "--cpu":
        print(cpu_table(Path(sys.argv[2])))
    else:
        print(table(Path(sys.argv[1])))

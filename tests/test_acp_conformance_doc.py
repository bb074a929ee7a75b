"""docs/providers.md's ACP conformance table is what scripts/acp_conformance.py generates from the probe data
(tests/support/acp_profiles.py, checked against the running agents by tests/test_acp_real_agents_served.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.acp_profiles import MODE_CHOSEN, PROBED, PROFILES, conformance
from threadloom.providers.acp.runtime import mode_value

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "acp_conformance.py"


def test_the_conformance_table_in_the_docs_is_the_one_the_probe_data_gives() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_fails_when_a_cell_of_the_table_is_edited(tmp_path: Path) -> None:
    """The twin: the same check on a copy of the doc with one cell changed by hand reports it stale."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import acp_conformance  # type: ignore[import-not-found]

    doc = (ROOT / "docs" / "providers.md").read_text()
    start = doc.index(acp_conformance.BEGIN)
    edited = doc[:start] + doc[start:].replace("| fallback |", "| native |", 1)
    assert edited != doc
    assert acp_conformance.rendered(edited) == doc  # regenerating restores the table
    assert acp_conformance.rendered(doc) == doc


def test_a_method_the_probe_finds_missing_turns_its_lifecycle_into_the_fallback() -> None:
    """The table follows the probe data: codex steers natively; with `_session/steering` found -32601 it is
    planned as the fallback."""
    assert conformance("codex")["steer"] == "native"
    saved = PROBED["codex"]["_session/steering"]
    PROBED["codex"]["_session/steering"] = "unsupported"
    try:
        assert conformance("codex")["steer"] == "fallback"
    finally:
        PROBED["codex"]["_session/steering"] = saved


def test_each_runtime_mode_selects_the_agents_own_mode_of_that_meaning() -> None:
    """Over the modes each real agent offers (checked against the agents by tests/test_acp_real_agents.py):
    codex-acp's `workspace-write` and `agent-full-access`, Qwen Code's `auto-edit` and `yolo`."""
    for name, chosen in MODE_CHOSEN.items():
        offered = set(PROFILES[name]["modes"])
        assert {mode: mode_value(mode, offered) for mode in chosen} == chosen, name
    # claude-agent-acp offers bypassPermissions unless it runs as root, as Threadloom runs it (the agent user)
    assert mode_value("full_access", {*PROFILES["claude"]["modes"], "bypassPermissions"}) == "bypassPermissions"

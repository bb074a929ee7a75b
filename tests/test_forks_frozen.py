"""A fork is frozen at its point: what it receives does not change when its source is later rolled back,
switched to another provider or forked again (real server, real git, the scripted agent).

What a user sees is asserted: the handoff the fork's transfer records, what the fork's agent holds (`@recall`
lists every user message and handoff its conversation holds) and the files its `@tool` commands read in the
fork's own folder. Each case has a twin fork made at the same point whose first message went out before the
source changed: the late fork must receive exactly the same text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

PROVIDERS = """
[instances.scripted]
driver = "scripted"

[instances.b]
driver = "scripted"
"""

FORK = """mutation($source: ForkSourceInput!, $ws: ForkWorkspace! = OWN) {
  forkThread(input: {source: $source, workspace: $ws}) {
    thread { id workspacePath } transfer { id status } userErrors { code message field } } }"""
TRANSFER = """query($id: ID!) { node(id: $id) { ... on ContextTransfer {
  status resolutionFidelity handoff { text status } } } }"""
ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  userErrors { code message } } }"""
SWITCH = """mutation($t: ID!, $i: String!) { switchProvider(input: {threadId: $t, providerInstanceId: $i}) {
  userErrors { code message } } }"""
STATUS = """query($r: ID!) { run(id: $r) { status } }"""
WARNINGS = """query($t: ID!) { thread(id: $t) { activities(first: 50) { nodes { kind summary } } } }"""


class Fork(ScriptedThread):
    """A fork, with the transfer its first run resolves."""

    transfer: str

    async def tool_outputs(self, text: str) -> list[str]:
        """The outputs of the `@tool` commands of a message on the fork (it must complete)."""
        sent = await send(self.client, self.id, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.client, sent["run"]["id"])
        assert done["status"] == "COMPLETED", done
        details = [c["detail"] or {} for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
        return [str(d["output"]) for d in details if "output" in d]

    async def received(self) -> dict[str, Any]:
        """The fork's transfer as its first run resolved it."""
        return (await self.client.gql(TRANSFER, {"id": self.transfer}))["node"]  # type: ignore[no-any-return]


async def fork_of(source: ScriptedThread, run: dict[str, Any], workspace: str = "OWN") -> Fork:
    data = (await source.client.gql(FORK, {"source": {"run": run["id"]}, "ws": workspace}))["forkThread"]
    assert data["userErrors"] == [], data
    fork = Fork(source.client, data["thread"]["id"], source.workspace)
    fork.transfer = data["transfer"]["id"]
    return fork


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def escaped(text: str) -> str:
    """A handoff as `@recall` lists it (one line)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


async def test_a_rollback_of_the_source_before_the_fork_point_changes_nothing_the_fork_receives(
    api: Client, tmp_path: Path
) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    await source.run("@write a.txt one\n@reply alpha")
    second = await source.run("@write a.txt two\n@write b.txt bee\n@reply beta")
    early, late = await fork_of(source, second), await fork_of(source, second)
    early_memory = await early.recall()  # the twin: its first message went out before the rollback
    expected = (await early.received())["handoff"]["text"]
    assert "@reply alpha" in expected and "@reply beta" in expected

    assert (await api.gql(ROLLBACK, {"t": source.id, "n": 1}))["rollbackToRun"]["userErrors"] == []
    assert (await api.gql(STATUS, {"r": second["id"]}))["run"]["status"] == "ROLLED_BACK"
    await source.run("@write c.txt sea\n@reply gamma")  # the source goes on from run 1
    assert (source.workspace / "a.txt").read_text() == "one" and not (source.workspace / "b.txt").exists()

    # The late fork's first message: the fork point's history and files, as the twin got them.
    assert await late.tool_outputs("@tool cat a.txt\n@tool cat b.txt\n@tool ls") == ["two", "bee", "a.txt\nb.txt\n"]
    transfer = await late.received()
    assert transfer["status"] == "RESOLVED_PORTABLE" and transfer["handoff"]["status"] == "DELIVERED"
    assert transfer["handoff"]["text"] == expected
    memory = await late.recall()
    assert memory[0] == early_memory[0] == f"handoff: {escaped(expected)}"
    assert memory[1:] == ["user: @tool cat a.txt\\n@tool cat b.txt\\n@tool ls"]
    assert "gamma" not in memory[0]


async def test_a_provider_switch_of_the_source_changes_nothing_the_fork_receives(api: Client, tmp_path: Path) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    await source.run("@reply alpha")
    second = await source.run("@reply beta")
    early, late = await fork_of(source, second), await fork_of(source, second)
    native = await fork_of(source, second, "SHARED")  # same instance, same folder: forked by the provider
    expected = (await early.received()) if await early.recall() else {}
    assert expected["status"] == "RESOLVED_PORTABLE"

    assert (await api.gql(SWITCH, {"t": source.id, "i": "b"}))["switchProvider"]["userErrors"] == []
    await source.run("@reply gamma")  # on b
    assert (await api.gql(SWITCH, {"t": source.id, "i": "scripted"}))["switchProvider"]["userErrors"] == []
    await source.run("@reply delta")  # back on the first provider thread, after a delta handoff about gamma
    held = await source.recall()
    assert "user: @reply delta" in held and any("gamma" in line for line in held)

    assert await late.recall() == [f"handoff: {escaped(expected['handoff']['text'])}"]
    assert (await late.received())["handoff"]["text"] == expected["handoff"]["text"]
    # The native fork is cut at the point's turn: nothing the source's provider thread got later.
    assert await native.recall() == ["user: @reply alpha", "user: @reply beta"]
    assert (await native.received())["status"] == "RESOLVED_NATIVE"


async def test_a_native_fork_whose_point_a_rollback_removed_gets_the_frozen_context(
    api: Client, tmp_path: Path
) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    await source.run("@reply alpha")
    second = await source.run("@reply beta")
    native, twin = await fork_of(source, second, "SHARED"), await fork_of(source, second, "SHARED")
    assert await twin.recall() == ["user: @reply alpha", "user: @reply beta"]  # forked by the provider

    assert (await api.gql(ROLLBACK, {"t": source.id, "n": 1}))["rollbackToRun"]["userErrors"] == []
    assert await source.recall() == ["user: @reply alpha"]  # the provider dropped the turn the fork points at

    memory = await native.recall()  # the provider cannot fork there any more: the context frozen at forkThread
    transfer = await native.received()
    assert transfer["status"] == "RESOLVED_PORTABLE" and transfer["resolutionFidelity"] == "summary"
    assert memory == [f"handoff: {escaped(transfer['handoff']['text'])}"]
    assert "@reply alpha" in transfer["handoff"]["text"] and "@reply beta" in transfer["handoff"]["text"]
    warnings = (await api.gql(WARNINGS, {"t": native.id}))["thread"]["activities"]["nodes"]
    assert any(w["kind"] == "runtime.warning" and "could not fork" in w["summary"] for w in warnings), warnings


async def test_a_fork_of_a_fork_keeps_its_ancestors_history_after_they_are_rolled_back(
    api: Client, tmp_path: Path
) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@reply alpha")
    second = await source.run("@reply beta")
    child = await fork_of(source, second)
    on_child = await child.run("@reply from-the-child")
    grandchild, twin = await fork_of(child, on_child), await fork_of(child, on_child)
    twin_memory = await twin.recall()
    assert len(twin_memory) == 1 and "@reply beta" in twin_memory[0] and "from-the-child" in twin_memory[0]

    assert (await api.gql(ROLLBACK, {"t": source.id, "n": 1}))["rollbackToRun"]["userErrors"] == []
    assert (await api.gql(ROLLBACK, {"t": child.id, "n": 0}))["rollbackToRun"]["userErrors"] == []
    fork_again = await fork_of(source, first)  # the source forked again: changes nothing either
    assert (await fork_again.received())["status"] == "PENDING"

    assert await grandchild.recall() == twin_memory

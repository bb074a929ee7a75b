"""forkThread against a real server and the scripted agent: lineage, lazy resolution, stable points.

What a user sees is asserted: the fork's lineage and transfer, and what the fork's agent remembers
(`@recall` lists every user message and handoff its conversation holds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.cli import create_token
from tests.support.graphql import statements
from tests.support.runs import send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.api.ids import decode

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

PROVIDERS = """
[instances.scripted]
driver = "scripted"

[instances.plain]
driver = "scripted"
supports_native_fork = false
"""

FORK = """mutation($source: ForkSourceInput!, $title: String, $key: String, $own: Boolean! = false) {
  forkThread(input: {source: $source, title: $title, clientMutationId: $key, ownWorkspace: $own}) {
    thread { id title providerThreads { id }
             lineage { relationship parentThread { id } rootThread { id } forkedFrom { id } } }
    transfer { id type status sourceThread { id } targetThread { id } sourceRun { id ordinal } targetRun { id }
               sourcePoint resolutionStrategy resolutionFidelity handoff { text } }
    userErrors { code message field } clientMutationId } }"""
TRANSFER = """query($id: ID!) { node(id: $id) { ... on ContextTransfer {
  status resolutionStrategy resolutionFidelity targetRun { id ordinal contextTransfers { id } }
  handoff { text status targetRun { id } } } } }"""
THREAD = """query($t: ID!) { thread(id: $t) {
  providerThreads { id forkedFrom { id } }
  lineage { forks(first: 50) { totalCount edges { node { id title } } } }
  transfers { id type } forkTransfers: transfers(type: FORK) { id } } }"""
RUN_CHECKPOINT = """query($r: ID!) { run(id: $r) { checkpoint { id } attempts { providerTurns { id } }
  providerThread { id } rootNode { id } } }"""
PROJECT_OF = """query($t: ID!) { thread(id: $t) { project { id } } }"""


class Thread(ScriptedThread):
    async def fork(self, source: dict[str, Any], **kw: Any) -> dict[str, Any]:
        data = await self.client.gql(FORK, {"source": source, **kw})
        return data["forkThread"]  # type: ignore[no-any-return]


def gid_uuid(global_id: str) -> str:
    """The uuid a Relay global id names (a fork's own folder is named by its project's and its own)."""
    decoded = decode(global_id)
    assert decoded is not None, global_id
    return str(decoded[1])


def _folder(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


async def forked(parent: Thread, source: dict[str, Any], **kw: Any) -> tuple[Thread, dict[str, Any]]:
    payload = await parent.fork(source, **kw)
    assert payload["userErrors"] == [], payload
    return Thread(parent.client, payload["thread"]["id"], parent.workspace), payload


async def test_a_native_fork_holds_the_conversation_up_to_its_point(api: Client, tmp_path: Path) -> None:
    source = await Thread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@reply alpha")
    await source.run("@reply beta")

    fork, payload = await forked(source, {"run": first["id"]}, title="explore")
    assert payload["thread"]["title"] == "explore"
    assert payload["thread"]["providerThreads"] == []  # nothing until the first run
    assert payload["thread"]["lineage"] == {
        "relationship": "FORK",
        "parentThread": {"id": source.id},
        "rootThread": {"id": source.id},
        "forkedFrom": {"id": payload["transfer"]["id"]},
    }
    transfer = payload["transfer"]
    assert transfer["type"] == "FORK" and transfer["status"] == "PENDING"
    assert transfer["sourceThread"] == {"id": source.id} and transfer["targetThread"] == {"id": fork.id}
    assert transfer["sourceRun"] == {"id": first["id"], "ordinal": 1} and transfer["targetRun"] is None

    assert await fork.recall() == ["user: @reply alpha"]
    resolved = (await api.gql(TRANSFER, {"id": transfer["id"]}))["node"]
    assert resolved["status"] == "RESOLVED_NATIVE" and resolved["resolutionFidelity"] == "exact"
    assert resolved["targetRun"]["ordinal"] == 1 and resolved["handoff"] is None
    assert resolved["targetRun"]["contextTransfers"] == [{"id": transfer["id"]}]

    view = (await api.gql(THREAD, {"t": fork.id}))["thread"]
    source_pt = (await api.gql(RUN_CHECKPOINT, {"r": first["id"]}))["run"]["providerThread"]["id"]
    assert [pt["forkedFrom"] for pt in view["providerThreads"]] == [{"id": source_pt}]
    parent = (await api.gql(THREAD, {"t": source.id}))["thread"]
    assert parent["lineage"]["forks"]["totalCount"] == 1
    assert parent["lineage"]["forks"]["edges"][0]["node"] == {"id": fork.id, "title": "explore"}
    assert parent["forkTransfers"] == [{"id": transfer["id"]}]
    # The source is untouched: it still remembers both runs.
    assert await source.recall() == ["user: @reply alpha", "user: @reply beta"]


async def test_a_portable_fork_gets_a_handoff_that_is_what_the_agent_received(api: Client, tmp_path: Path) -> None:
    source = await Thread.create(api, _folder(tmp_path / "ws"), instance="plain")
    first = await source.run("@reply alpha")
    await source.run("@reply beta")

    fork, payload = await forked(source, {"run": first["id"]})
    assert payload["thread"]["title"].startswith("Fork of ")
    memory = await fork.recall()
    resolved = (await api.gql(TRANSFER, {"id": payload["transfer"]["id"]}))["node"]
    assert resolved["status"] == "RESOLVED_PORTABLE" and resolved["resolutionFidelity"] == "summary"
    handoff = resolved["handoff"]
    assert handoff["status"] == "DELIVERED" and handoff["targetRun"] == {"id": resolved["targetRun"]["id"]}
    escaped = handoff["text"].replace("\\", "\\\\").replace("\n", "\\n")
    assert memory == [f"handoff: {escaped}"]
    assert "@reply alpha" in handoff["text"] and "@reply beta" not in handoff["text"]


async def test_unstable_points_are_refused_with_the_latest_stable_run(api: Client, tmp_path: Path) -> None:
    source = await Thread.create(api, _folder(tmp_path / "ws"))
    await source.run("@reply alpha")
    waiting = await send(api, source.id, "@approval echo hi")
    await until(lambda: _status_is(api, waiting["run"]["id"], "WAITING"))
    queued = await send(api, source.id, "@reply later", d={"queueAfterActive": True})
    assert queued["run"]["status"] == "QUEUED", queued

    for run_id in (waiting["run"]["id"], queued["run"]["id"]):
        refused = await source.fork({"run": run_id})
        assert refused["thread"] is None
        [error] = refused["userErrors"]
        assert error["code"] == "UNSTABLE_FORK_POINT" and error["field"] == "source.run"
        assert error["message"].endswith("the latest stable point is run 1"), error
    facts = (await api.gql(RUN_CHECKPOINT, {"r": waiting["run"]["id"]}))["run"]
    node = facts["rootNode"]["id"]
    refused = await source.fork({"node": node})
    assert [e["code"] for e in refused["userErrors"]] == ["UNSTABLE_FORK_POINT"]
    turn = facts["attempts"][-1]["providerTurns"][-1]["id"]  # the turn waiting for the approval
    for point in ({"id": facts["providerThread"]["id"], "turnId": turn}, {"id": facts["providerThread"]["id"]}):
        refused = await source.fork({"providerThread": point})
        assert [e["code"] for e in refused["userErrors"]] == ["UNSTABLE_FORK_POINT"], point
    two = await api.post(FORK, {"source": {"run": waiting["run"]["id"], "node": node}})  # @oneOf: exactly one field
    assert "data" not in two.json() and "exactly one" in str(two.json()["errors"]).lower(), two.json()
    view = (await api.gql(THREAD, {"t": source.id}))["thread"]
    assert view["lineage"]["forks"]["totalCount"] == 0 and view["transfers"] == []


async def _status_is(api: Client, run_id: str, status: str) -> bool:
    data = await api.gql("query($r: ID!) { run(id: $r) { status } }", {"r": run_id})
    return bool(data["run"]["status"] == status)


async def test_forks_of_forks_keep_the_root_and_carry_the_whole_history(api: Client, tmp_path: Path) -> None:
    for instance in ("scripted", "plain"):
        source = await Thread.create(api, _folder(tmp_path / f"ws-{instance}"), instance=instance)
        first = await source.run("@reply root one")
        await source.run("@reply root two")
        child, _ = await forked(source, {"run": first["id"]})
        on_child = await child.run("@reply child one")
        grandchild, payload = await forked(child, {"run": on_child["id"]})
        assert payload["thread"]["lineage"]["rootThread"] == {"id": source.id}
        assert payload["thread"]["lineage"]["parentThread"] == {"id": child.id}
        memory = "\n".join(await grandchild.recall())
        assert "root one" in memory and "child one" in memory and "root two" not in memory, (instance, memory)


async def test_fork_from_a_checkpoint_a_provider_turn_and_a_root_node(api: Client, tmp_path: Path) -> None:
    source = await Thread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@reply alpha")
    second = await source.run("@reply beta")
    await source.run("@reply gamma")
    facts = (await api.gql(RUN_CHECKPOINT, {"r": second["id"]}))["run"]

    by_checkpoint, payload = await forked(source, {"checkpoint": facts["checkpoint"]["id"]})
    assert payload["transfer"]["sourceRun"]["ordinal"] == 2
    assert await by_checkpoint.recall() == ["user: @reply alpha", "user: @reply beta"]

    turn = facts["attempts"][-1]["providerTurns"][-1]["id"]
    by_turn, _ = await forked(source, {"providerThread": {"id": facts["providerThread"]["id"], "turnId": turn}})
    assert await by_turn.recall() == ["user: @reply alpha", "user: @reply beta"]

    root = (await api.gql(RUN_CHECKPOINT, {"r": first["id"]}))["run"]["rootNode"]["id"]
    by_node, _ = await forked(source, {"node": root})
    assert await by_node.recall() == ["user: @reply alpha"]


async def test_fork_is_idempotent_and_invisible_to_other_projects(
    server: ServerProcess, api: Client, tmp_path: Path, database_url: str
) -> None:
    source = await Thread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@reply alpha")
    once = await source.fork({"run": first["id"]}, key="k1")
    again = await source.fork({"run": first["id"]}, key="k1")
    assert once["userErrors"] == [] and again["thread"]["id"] == once["thread"]["id"]
    assert again["clientMutationId"] == "k1"

    other = await Thread.create(api, _folder(tmp_path / "other"))
    project = (await api.gql(PROJECT_OF, {"t": other.id}))["thread"]["project"]["id"]
    _, token = create_token(database_url, "operate", project)
    stranger = Client(server.url, token)
    try:
        refused = (await stranger.gql(FORK, {"source": {"run": first["id"]}}))["forkThread"]
        assert refused["thread"] is None
        assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("NOT_FOUND", "source.run")]
        merged = (await stranger.gql(MERGE, {"f": once["thread"]["id"]}))["mergeBack"]
        assert [(e["code"], e["field"]) for e in merged["userErrors"]] == [("NOT_FOUND", "forkThreadId")]
    finally:
        await stranger.aclose()
    own = (await api.gql(PROJECT_OF, {"t": source.id}))["thread"]["project"]["id"]
    _, reader_token = create_token(database_url, "read", own)  # sees the source, may not change anything
    reader = Client(server.url, reader_token)
    try:
        refused = (await reader.gql(FORK, {"source": {"run": first["id"]}}))["forkThread"]
        assert refused["thread"] is None and [e["code"] for e in refused["userErrors"]] == ["FORBIDDEN"]
    finally:
        await reader.aclose()
    view = (await api.gql(THREAD, {"t": source.id}))["thread"]
    assert view["lineage"]["forks"]["totalCount"] == 1


TREE = """query($t: ID!) { thread(id: $t) { lineage { forks(first: 50) { totalCount edges { node {
  id title transfers { id type status }
  lineage { relationship rootThread { id } forkedFrom { status sourceRun { ordinal } handoff { text } }
            forks(first: 50) { totalCount edges { node { id lineage { forkedFrom { id } } } } } } } } } } } }"""


async def test_the_fork_tree_costs_the_same_statements_for_2_and_20_forks(api: Client, tmp_path: Path) -> None:
    counts = {}
    for size in (2, 20):
        source = await Thread.create(api, _folder(tmp_path / f"ws{size}"))
        first = await source.run("@reply alpha")
        children = [(await forked(source, {"run": first["id"]}))[0] for _ in range(size)]
        for child in children[:2]:  # grandchildren under two of them
            on_child = await child.run("@reply on the child")
            await forked(child, {"checkpoint": await _checkpoint(api, on_child["id"])})
        response = await api.post(TREE, {"t": source.id})
        body = response.json()
        assert "errors" not in body, body
        forks = body["data"]["thread"]["lineage"]["forks"]
        assert forks["totalCount"] == size and len(forks["edges"]) == size
        assert sum(e["node"]["lineage"]["forks"]["totalCount"] for e in forks["edges"]) == 2
        counts[size] = statements(dict(response.headers))
    assert counts[2] == counts[20], counts


async def _checkpoint(api: Client, run_id: str) -> str:
    return str((await api.gql(RUN_CHECKPOINT, {"r": run_id}))["run"]["checkpoint"]["id"])


DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id runs(first: 1) { edges { node { id } } } } userErrors { code } } }"""
SUBAGENT_NODES = """query($r: ID!) { run(id: $r) { executionGraph { nodes { id kind status childThread { id } } } } }"""


async def test_fork_from_a_completed_subagent_node_continues_its_child_thread(api: Client, tmp_path: Path) -> None:
    parent = await Thread.create(api, _folder(tmp_path / "ws"))
    waiting = await send(api, parent.id, "@approval echo hi")  # the parent's run stays active meanwhile
    await until(lambda: _status_is(api, waiting["run"]["id"], "WAITING"))
    made = (await api.gql(DELEGATE, {"t": parent.id, "text": "@reply from the subagent"}))["delegateTask"]
    assert made["userErrors"] == [], made
    child_id = made["thread"]["id"]

    async def subagent_node() -> dict[str, Any] | None:
        graph = (await api.gql(SUBAGENT_NODES, {"r": waiting["run"]["id"]}))["run"]["executionGraph"]
        found = [n for n in graph["nodes"] if n["kind"] == "SUBAGENT"]
        return found[0] if found and found[0]["status"] == "COMPLETED" else None

    node = await until(subagent_node)
    assert node["childThread"] == {"id": child_id}
    fork, payload = await forked(parent, {"node": node["id"]})
    assert payload["thread"]["lineage"]["parentThread"] == {"id": child_id}
    assert payload["thread"]["lineage"]["rootThread"] == {"id": parent.id}
    assert await fork.recall() == ["user: @reply from the subagent"]


MERGE = """mutation($f: ID!, $key: String) { mergeBack(input: {forkThreadId: $f, clientMutationId: $key}) {
  thread { id } transfer { id type status basePoint sourcePoint sourceThread { id } targetThread { id } }
  userErrors { code message field } } }"""


async def merge(api: Client, fork: Thread, key: str | None = None) -> dict[str, Any]:
    return (await api.gql(MERGE, {"f": fork.id, "key": key}))["mergeBack"]  # type: ignore[no-any-return]


def handoff_lines(memory: list[str]) -> list[str]:
    return [line for line in memory if line.startswith("handoff: ")]


async def test_merge_back_brings_each_forks_own_delta_to_the_source(api: Client, tmp_path: Path) -> None:
    source = await Thread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@reply alpha")
    one, _ = await forked(source, {"run": first["id"]}, title="one")
    two, _ = await forked(source, {"run": first["id"]}, title="two")
    await one.run("@reply idea from fork one")
    await one.run("@write one.txt decided")
    await two.run("@reply idea from fork two")

    merged = await merge(api, one, key="m1")
    assert merged["userErrors"] == [], merged
    transfer = merged["transfer"]
    assert (transfer["type"], transfer["status"]) == ("MERGE_BACK", "PENDING")
    assert transfer["sourceThread"] == {"id": one.id} and transfer["targetThread"] == {"id": source.id}
    assert merged["thread"] == {"id": source.id}
    assert transfer["basePoint"]["runOrdinal"] == 1 and transfer["sourcePoint"]["runOrdinal"] == 2
    assert (await merge(api, one, key="m1"))["transfer"]["id"] == transfer["id"]  # the key replays

    memory = handoff_lines(await source.recall())
    assert len(memory) == 1
    assert "idea from fork one" in memory[0] and "one.txt" in memory[0] and "fork two" not in memory[0]
    consumed = (await api.gql(TRANSFER, {"id": transfer["id"]}))["node"]
    assert consumed["status"] == "CONSUMED" and consumed["handoff"]["status"] == "DELIVERED"
    assert handoff_lines([f"handoff: {consumed['handoff']['text']}".replace("\n", "\\n")]) == memory

    assert (await merge(api, two))["userErrors"] == []
    memory = handoff_lines(await source.recall())
    assert len(memory) == 2 and "idea from fork two" in memory[1] and "fork one" not in memory[1]

    again = await merge(api, one)
    assert [e["code"] for e in again["userErrors"]] == ["NOTHING_TO_MERGE"] and again["transfer"] is None
    not_a_fork = (await api.gql(MERGE, {"f": source.id}))["mergeBack"]
    assert [e["code"] for e in not_a_fork["userErrors"]] == ["NOT_A_FORK"]


ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  userErrors { code message } } }"""
FILES = """query($r: ID!) { run(id: $r) { checkpoint { files { path } } } }"""


async def test_a_fork_with_its_own_workspace_starts_from_the_fork_points_files(
    api: Client, tmp_path: Path, data_dir: Path
) -> None:
    root = _folder(tmp_path / "ws")
    source = await Thread.create(api, root)
    first = await source.run("@write a.txt one")
    await source.run("@write a.txt two\n@write b.txt later")

    fork, _ = await forked(source, {"checkpoint": await _checkpoint(api, first["id"])}, own=True)
    path = (await api.gql("query($t: ID!) { thread(id: $t) { workspacePath project { id } } }", {"t": fork.id}))
    project = gid_uuid(path["thread"]["project"]["id"])
    assert path["thread"]["workspacePath"] == f"forks/{gid_uuid(fork.id)}"
    own = data_dir / "workspaces" / project / path["thread"]["workspacePath"]  # the data dir's
    assert not (root / ".threadloom").exists()  # nothing inside the project's workspace
    assert (own / "a.txt").read_text() == "one" and not (own / "b.txt").exists()  # made by forkThread

    on_fork = await fork.run("@write c.txt fork")
    assert (own / "c.txt").read_text() == "fork" and not (root / "c.txt").exists()
    assert (root / "a.txt").read_text() == "two"  # the source's files are untouched
    changed = (await api.gql(FILES, {"r": on_fork["id"]}))["run"]["checkpoint"]["files"]
    assert [f["path"] for f in changed] == ["c.txt"]

    on_source = await source.run("@write d.txt main")
    main_files = [f["path"] for f in (await api.gql(FILES, {"r": on_source["id"]}))["run"]["checkpoint"]["files"]]
    assert main_files == ["d.txt"]  # the fork's folder is never part of the project's checkpoints

    assert (await api.gql(ROLLBACK, {"t": fork.id, "n": 0}))["rollbackToRun"]["userErrors"] == []
    assert not (own / "c.txt").exists() and (own / "a.txt").read_text() == "one"
    assert (root / "d.txt").exists()  # rolling the fork back leaves the project's files alone
    assert (await api.gql(ROLLBACK, {"t": source.id, "n": 1}))["rollbackToRun"]["userErrors"] == []
    assert (own / "a.txt").read_text() == "one" and (root / "a.txt").read_text() == "one"
    assert not (root / "d.txt").exists()  # and rolling the source back leaves the fork's folder alone

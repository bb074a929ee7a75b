"""Management over the API, against a real server: renaming and archiving projects, a workspace folder
that is gone, and tokens made, listed and revoked by a project's own admin.

Every command is tried with a token of another project (NOT_FOUND, the same answer as for an unknown
id) and a token of the right project below admin scope (FORBIDDEN), each beside its twin that works,
and each refusal is checked to have changed nothing.
"""

from __future__ import annotations

import base64
import shutil
import uuid
from pathlib import Path
from typing import Any

from tests.support.cli import create_token
from tests.support.graphql import CREATE_THREAD, make_project, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

UPDATE = """mutation($p: ID!, $n: String) { updateProject(input: {projectId: $p, name: $n}) {
  project { id name } userErrors { code field } } }"""
ARCHIVE = """mutation($p: ID!) { archiveProject(input: {projectId: $p}) {
  project { id archivedAt } userErrors { code field } } }"""
UNARCHIVE = """mutation($p: ID!) { unarchiveProject(input: {projectId: $p}) {
  project { id archivedAt } userErrors { code field } } }"""
PROJECTS = """query($all: Boolean!) { projects(first: 100, includeArchived: $all) { nodes { id } } }"""
PROJECT = "query($p: ID!) { project(id: $p) { name archivedAt workspaceStatus threads { totalCount } } }"
RUNS = "query($t: ID!) { thread(id: $t) { runs { totalCount } } }"
CREATE_TOKEN = """mutation($p: ID, $n: String!, $s: TokenScope!, $e: Int) {
  createToken(input: {projectId: $p, name: $n, scope: $s, expiresInSeconds: $e}) {
    token { id name scope state expiresAt revokedAt project { id } } secret userErrors { code field } } }"""
REVOKE_TOKEN = """mutation($t: ID!) { revokeToken(input: {tokenId: $t}) {
  token { id state revokedAt } userErrors { code field } } }"""
TOKENS = """query($p: ID, $r: Boolean!) { tokens(projectId: $p, includeRevoked: $r) {
  id name scope state project { id } } }"""
VIEWER = "{ viewer { scope project { id } } }"


def unknown(type_name: str) -> str:
    return base64.urlsafe_b64encode(f"{type_name}:{uuid.uuid4()}".encode()).decode().rstrip("=")


async def _two_projects(client: Client, database_url: str, tmp_path: Path) -> dict[str, Any]:
    """Projects A and B, A's admin and operate tokens, B's admin token."""
    a = await make_project(client, "A", workspace(tmp_path, "a"))
    b = await make_project(client, "B", workspace(tmp_path, "b"))
    return {
        "a": a,
        "b": b,
        "a_admin": create_token(database_url, "admin", a)[1],
        "a_operate": create_token(database_url, "operate", a)[1],
        "b_admin": create_token(database_url, "admin", b)[1],
    }


def _codes(payload: dict[str, Any]) -> list[str]:
    return [e["code"] for e in payload["userErrors"]]


async def _name(client: Client, project: str) -> str:
    return (await client.gql(PROJECT, {"p": project}))["project"]["name"]  # type: ignore[no-any-return]


# ---- updateProject ------------------------------------------------------------------------


async def test_update_project_renames_for_its_admin_only(client: Client, database_url: str, tmp_path: Path) -> None:
    t = await _two_projects(client, database_url, tmp_path)
    other = (await client.gql(UPDATE, {"p": t["a"], "n": "by B"}, token=t["b_admin"]))["updateProject"]
    missing = (await client.gql(UPDATE, {"p": unknown("Project"), "n": "x"}, token=t["b_admin"]))["updateProject"]
    assert other == missing == {"project": None, "userErrors": [{"code": "NOT_FOUND", "field": "projectId"}]}
    under = (await client.gql(UPDATE, {"p": t["a"], "n": "by operate"}, token=t["a_operate"]))["updateProject"]
    assert _codes(under) == ["FORBIDDEN"] and under["project"] is None
    assert await _name(client, t["a"]) == "A"  # the refusals changed nothing

    done = (await client.gql(UPDATE, {"p": t["a"], "n": "  Renamed   A "}, token=t["a_admin"]))["updateProject"]
    assert done == {"project": {"id": t["a"], "name": "Renamed A"}, "userErrors": []}
    kept = (await client.gql(UPDATE, {"p": t["a"], "n": None}, token=t["a_admin"]))["updateProject"]
    assert kept["project"]["name"] == "Renamed A"  # an absent name keeps the current one
    blank = (await client.gql(UPDATE, {"p": t["a"], "n": "  "}, token=t["a_admin"]))["updateProject"]
    assert blank["userErrors"] == [{"code": "INVALID_INPUT", "field": "name"}]
    assert await _name(client, t["a"]) == "Renamed A"


# ---- archiveProject / unarchiveProject ----------------------------------------------------


async def test_archived_project_leaves_lists_and_refuses_messages_until_unarchived(
    client: Client, tmp_path: Path
) -> None:
    project = await make_project(client, "P", workspace(tmp_path, "p"))
    thread = (await make_thread(client, project))["id"]

    archived = (await client.gql(ARCHIVE, {"p": project}))["archiveProject"]
    assert archived["userErrors"] == [] and archived["project"]["archivedAt"] is not None
    listed = (await client.gql(PROJECTS, {"all": False}))["projects"]["nodes"]
    assert {"id": project} not in listed
    assert {"id": project} in (await client.gql(PROJECTS, {"all": True}))["projects"]["nodes"]
    again = (await client.gql(ARCHIVE, {"p": project}))["archiveProject"]
    assert _codes(again) == ["ALREADY_ARCHIVED"]

    refused = await send(client, thread, "hello")
    assert refused["run"] is None
    assert refused["userErrors"][0]["code"] == "PROJECT_ARCHIVED"
    assert (await client.gql(RUNS, {"t": thread}))["thread"]["runs"]["totalCount"] == 0
    made = (await client.gql(CREATE_THREAD, {"projectId": project, "title": "late"}))["createThread"]
    assert made["thread"] is None and made["userErrors"][0]["code"] == "PROJECT_ARCHIVED"
    assert (await client.gql(PROJECT, {"p": project}))["project"]["threads"]["totalCount"] == 1

    back = (await client.gql(UNARCHIVE, {"p": project}))["unarchiveProject"]
    assert back == {"project": {"id": project, "archivedAt": None}, "userErrors": []}
    assert {"id": project} in (await client.gql(PROJECTS, {"all": False}))["projects"]["nodes"]
    assert _codes((await client.gql(UNARCHIVE, {"p": project}))["unarchiveProject"]) == ["NOT_ARCHIVED"]
    sent = await send(client, thread, "hello again")
    assert sent["userErrors"] == []
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"


async def test_archive_is_refused_to_another_project_and_below_admin(
    client: Client, database_url: str, tmp_path: Path
) -> None:
    t = await _two_projects(client, database_url, tmp_path)
    for document, field in ((ARCHIVE, "archiveProject"), (UNARCHIVE, "unarchiveProject")):
        other = (await client.gql(document, {"p": t["a"]}, token=t["b_admin"]))[field]
        missing = (await client.gql(document, {"p": unknown("Project")}, token=t["b_admin"]))[field]
        assert other == missing == {"project": None, "userErrors": [{"code": "NOT_FOUND", "field": "projectId"}]}
        assert _codes((await client.gql(document, {"p": t["a"]}, token=t["a_operate"]))[field]) == ["FORBIDDEN"]
    assert (await client.gql(PROJECT, {"p": t["a"]}))["project"]["archivedAt"] is None

    # The twins: A's own admin archives and unarchives A; B's list never showed A.
    assert (await client.gql(ARCHIVE, {"p": t["a"]}, token=t["a_admin"]))["archiveProject"]["userErrors"] == []
    assert (await client.gql(PROJECTS, {"all": True}, token=t["b_admin"]))["projects"]["nodes"] == [{"id": t["b"]}]
    assert (await client.gql(PROJECTS, {"all": True}, token=t["a_admin"]))["projects"]["nodes"] == [{"id": t["a"]}]
    assert (await client.gql(PROJECTS, {"all": False}, token=t["a_admin"]))["projects"]["nodes"] == []
    assert (await client.gql(UNARCHIVE, {"p": t["a"]}, token=t["a_admin"]))["unarchiveProject"]["userErrors"] == []


# ---- a workspace folder that is gone ------------------------------------------------------


async def test_missing_workspace_is_reported_and_refuses_messages(client: Client, tmp_path: Path) -> None:
    root = Path(workspace(tmp_path, "gone"))
    project = await make_project(client, "G", str(root))
    thread = (await make_thread(client, project))["id"]
    assert (await client.gql(PROJECT, {"p": project}))["project"]["workspaceStatus"] == "OK"

    shutil.rmtree(root)
    assert (await client.gql(PROJECT, {"p": project}))["project"]["workspaceStatus"] == "MISSING"
    refused = await send(client, thread, "into the void")
    assert refused["run"] is None and refused["userErrors"][0]["code"] == "WORKSPACE_MISSING"

    root.write_text("a file where the folder was")  # noqa: ASYNC240 (test setup, instant)
    assert (await client.gql(PROJECT, {"p": project}))["project"]["workspaceStatus"] == "NOT_A_DIRECTORY"
    refused = await send(client, thread, "into a file")
    assert refused["userErrors"][0]["code"] == "WORKSPACE_MISSING"
    assert (await client.gql(RUNS, {"t": thread}))["thread"]["runs"]["totalCount"] == 0

    root.unlink()  # noqa: ASYNC240 (test setup, instant)
    Path(workspace(tmp_path, "gone"))  # the folder is back: so is the project
    assert (await client.gql(PROJECT, {"p": project}))["project"]["workspaceStatus"] == "OK"
    sent = await send(client, thread, "home again")
    assert sent["userErrors"] == []
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"


async def test_workspace_check_tells_another_project_nothing(client: Client, database_url: str, tmp_path: Path) -> None:
    t = await _two_projects(client, database_url, tmp_path)
    thread = (await make_thread(client, t["a"]))["id"]
    shutil.rmtree(tmp_path / "a")
    b_operate = create_token(database_url, "operate", t["b"])[1]
    other = (await client.gql(SEND_CODES, {"t": thread}, token=b_operate))["sendMessage"]
    missing = (await client.gql(SEND_CODES, {"t": unknown("Thread")}, token=b_operate))["sendMessage"]
    assert other == missing == {"run": None, "userErrors": [{"code": "NOT_FOUND", "field": "threadId"}]}
    a_read = create_token(database_url, "read", t["a"])[1]
    assert (await client.gql(SEND_CODES, {"t": thread}, token=a_read))["sendMessage"]["userErrors"][0][
        "code"
    ] == "FORBIDDEN"
    mine = (await client.gql(SEND_CODES, {"t": thread}, token=t["a_operate"]))["sendMessage"]
    assert mine == {"run": None, "userErrors": [{"code": "WORKSPACE_MISSING", "field": "threadId"}]}


SEND_CODES = """mutation($t: ID!) { sendMessage(input: {threadId: $t, text: "hi"}) {
  run { id } userErrors { code field } } }"""


# ---- tokens -------------------------------------------------------------------------------


async def test_project_admin_creates_a_token_whose_secret_is_shown_once_and_works(
    client: Client, database_url: str, tmp_path: Path
) -> None:
    t = await _two_projects(client, database_url, tmp_path)
    made = (
        await client.gql(CREATE_TOKEN, {"p": t["a"], "n": "ci reader", "s": "READ", "e": 3600}, token=t["a_admin"])
    )["createToken"]
    assert made["userErrors"] == []
    token = made["token"]
    assert token["name"] == "ci reader" and token["scope"] == "READ" and token["state"] == "ACTIVE"
    assert token["project"] == {"id": t["a"]} and token["expiresAt"] is not None and token["revokedAt"] is None
    assert made["secret"].startswith("tl_")

    seen = await client.gql(VIEWER, token=made["secret"])
    assert seen == {"viewer": {"scope": "READ", "project": {"id": t["a"]}}}
    listed = (await client.gql(TOKENS, {"p": t["a"], "r": False}, token=t["a_admin"]))["tokens"]
    assert {
        "id": token["id"],
        "name": "ci reader",
        "scope": "READ",
        "state": "ACTIVE",
        "project": {"id": t["a"]},
    } in listed
    assert all(row["project"] == {"id": t["a"]} for row in listed)
    fields = await client.gql('{ __type(name: "ApiToken") { fields { name } } }')
    assert "secret" not in {f["name"] for f in fields["__type"]["fields"]}  # never shown again


async def test_create_token_is_refused_to_another_project_below_admin_and_for_all_projects(
    client: Client, database_url: str, tmp_path: Path
) -> None:
    t = await _two_projects(client, database_url, tmp_path)
    name = f"x-{uuid.uuid4().hex[:8]}"  # the test's own: all-projects tokens of other tests share the list
    ask = {"p": t["a"], "n": name, "s": "OPERATE", "e": None}
    other = (await client.gql(CREATE_TOKEN, ask, token=t["b_admin"]))["createToken"]
    missing = (await client.gql(CREATE_TOKEN, {**ask, "p": unknown("Project")}, token=t["b_admin"]))["createToken"]
    nothing = {"token": None, "secret": None, "userErrors": [{"code": "NOT_FOUND", "field": "projectId"}]}
    assert other == missing == nothing
    under = (await client.gql(CREATE_TOKEN, ask, token=t["a_operate"]))["createToken"]
    assert _codes(under) == ["FORBIDDEN"] and under["secret"] is None
    everywhere = (await client.gql(CREATE_TOKEN, {**ask, "p": None}, token=t["a_admin"]))["createToken"]
    assert _codes(everywhere) == ["FORBIDDEN"]  # a project's admin makes no token for all projects
    never = (await client.gql(CREATE_TOKEN, {**ask, "e": 0}, token=t["a_admin"]))["createToken"]
    assert never["userErrors"] == [{"code": "INVALID_INPUT", "field": "expiresInSeconds"}]
    blank = (await client.gql(CREATE_TOKEN, {**ask, "n": " "}, token=t["a_admin"]))["createToken"]
    assert blank["userErrors"] == [{"code": "INVALID_INPUT", "field": "name"}]
    made = (await client.gql(TOKENS, {"p": t["a"], "r": True}))["tokens"] + (
        await client.gql(TOKENS, {"p": None, "r": True})
    )["tokens"]
    assert [row for row in made if row["name"] == name] == []  # none of the refused ones was made

    # The twins: A's admin makes one for A; the all-projects admin makes one for all projects.
    mine = (await client.gql(CREATE_TOKEN, ask, token=t["a_admin"]))["createToken"]
    assert mine["userErrors"] == [] and mine["token"]["project"] == {"id": t["a"]}
    wide = (await client.gql(CREATE_TOKEN, {**ask, "p": None, "s": "ADMIN"}))["createToken"]
    assert wide["userErrors"] == [] and wide["token"]["project"] is None
    assert (await client.gql(VIEWER, token=wide["secret"]))["viewer"] == {"scope": "ADMIN", "project": None}


async def test_revoked_token_stops_working_and_only_its_projects_admin_may_revoke_it(
    client: Client, database_url: str, tmp_path: Path
) -> None:
    t = await _two_projects(client, database_url, tmp_path)
    made = (await client.gql(CREATE_TOKEN, {"p": t["a"], "n": "temp", "s": "READ"}, token=t["a_admin"]))["createToken"]
    token_id, secret = made["token"]["id"], made["secret"]

    other = (await client.gql(REVOKE_TOKEN, {"t": token_id}, token=t["b_admin"]))["revokeToken"]
    missing = (await client.gql(REVOKE_TOKEN, {"t": unknown("ApiToken")}, token=t["b_admin"]))["revokeToken"]
    assert other == missing == {"token": None, "userErrors": [{"code": "NOT_FOUND", "field": "tokenId"}]}
    under = (await client.gql(REVOKE_TOKEN, {"t": token_id}, token=t["a_operate"]))["revokeToken"]
    assert _codes(under) == ["FORBIDDEN"]
    wide_id = create_token(database_url, "admin")[0]  # an all-projects token is out of a project admin's reach
    wide_gid = base64.urlsafe_b64encode(f"ApiToken:{wide_id}".encode()).decode().rstrip("=")
    assert _codes((await client.gql(REVOKE_TOKEN, {"t": wide_gid}, token=t["a_admin"]))["revokeToken"]) == ["NOT_FOUND"]
    assert (await client.post(VIEWER, token=secret)).status_code == 200  # still works after the refusals

    done = (await client.gql(REVOKE_TOKEN, {"t": token_id}, token=t["a_admin"]))["revokeToken"]
    assert done["userErrors"] == [] and done["token"]["state"] == "REVOKED" and done["token"]["revokedAt"]
    assert (await client.post(VIEWER, token=secret)).status_code == 401
    again = (await client.gql(REVOKE_TOKEN, {"t": token_id}, token=t["a_admin"]))["revokeToken"]
    assert again["userErrors"] == [{"code": "TOKEN_REVOKED", "field": "tokenId"}]
    active = (await client.gql(TOKENS, {"p": t["a"], "r": False}, token=t["a_admin"]))["tokens"]
    assert token_id not in {row["id"] for row in active}
    every = (await client.gql(TOKENS, {"p": t["a"], "r": True}, token=t["a_admin"]))["tokens"]
    assert {"id": token_id, "state": "REVOKED"}.items() <= next(r for r in every if r["id"] == token_id).items()


async def test_tokens_query_answers_only_a_projects_admins(client: Client, database_url: str, tmp_path: Path) -> None:
    t = await _two_projects(client, database_url, tmp_path)
    other = (await client.gql(TOKENS, {"p": t["a"], "r": True}, token=t["b_admin"]))["tokens"]
    missing = (await client.gql(TOKENS, {"p": unknown("Project"), "r": True}, token=t["b_admin"]))["tokens"]
    assert other is None and missing is None
    under = (await client.post(TOKENS, {"p": t["a"], "r": True}, token=t["a_operate"])).json()
    assert under["data"] == {"tokens": None}
    assert under["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    wide = (await client.post(TOKENS, {"p": None, "r": True}, token=t["a_admin"])).json()
    assert wide["errors"][0]["extensions"]["code"] == "FORBIDDEN"  # all-projects tokens: all-projects admins

    mine = (await client.gql(TOKENS, {"p": t["a"], "r": True}, token=t["a_admin"]))["tokens"]
    assert sorted(row["scope"] for row in mine) == ["ADMIN", "OPERATE"]
    everywhere = (await client.gql(TOKENS, {"p": None, "r": True}))["tokens"]
    assert everywhere and all(row["project"] is None for row in everywhere)


RETRY = """mutation($r: ID!) { retryRun(input: {runId: $r}) { run { id status } userErrors { code field } } }"""
RESUME = (
    """mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { thread { queueHeld } userErrors { code field } } }"""
)


async def test_retry_and_resume_are_refused_in_an_archived_project(client: Client, tmp_path: Path) -> None:
    """The other ways to start a run (retryRun, resumeQueue) pass the same check as sendMessage."""
    project = await make_project(client, "R", workspace(tmp_path, "r"))
    thread = (await make_thread(client, project))["id"]
    failed = await send(client, thread, "@fail on purpose")
    assert (await finished(client, failed["run"]["id"]))["status"] == "FAILED"  # the queue is held now
    assert (await client.gql(ARCHIVE, {"p": project}))["archiveProject"]["userErrors"] == []

    retry = (await client.gql(RETRY, {"r": failed["run"]["id"]}))["retryRun"]
    assert retry == {"run": None, "userErrors": [{"code": "PROJECT_ARCHIVED", "field": "threadId"}]}
    resume = (await client.gql(RESUME, {"t": thread}))["resumeQueue"]
    assert resume == {"thread": None, "userErrors": [{"code": "PROJECT_ARCHIVED", "field": "threadId"}]}
    assert (await client.gql(RUNS, {"t": thread}))["thread"]["runs"]["totalCount"] == 1

    # The twins, once unarchived: the queue resumes, and the failed run is retried.
    assert (await client.gql(UNARCHIVE, {"p": project}))["unarchiveProject"]["userErrors"] == []
    assert (await client.gql(RESUME, {"t": thread}))["resumeQueue"] == {
        "thread": {"queueHeld": False},
        "userErrors": [],
    }
    again = (await client.gql(RETRY, {"r": failed["run"]["id"]}))["retryRun"]
    assert again["userErrors"] == [] and again["run"]["id"] == failed["run"]["id"]

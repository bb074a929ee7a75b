"""implementPlan with target NEW_THREAD: a refusal on the way leaves the plan to implement.

The new thread's log is written by commands of its own, so the thread and its run are made first and
the plan is marked last. When the thread cannot be created (here the instance no longer allows the
source thread's `full_access` after a configuration change and a restart), the request is refused,
the plan stays FINALIZED and no thread is left behind.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.graphql import CREATE_PROJECT, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess

IMPLEMENT = """mutation($p: ID!) { implementPlan(input: {planId: $p, target: NEW_THREAD}) {
  plan { status } thread { id } run { id } userErrors { code field } } }"""
PLAN = "query($p: ID!) { node(id: $p) { ... on PlanArtifact { status } } }"
THREADS = "query($p: ID!) { project(id: $p) { threads(first: 10) { totalCount } } }"


async def test_a_refused_new_thread_leaves_the_plan_to_implement(database_url: str, tmp_path: Path) -> None:
    config = tmp_path / "providers.toml"
    config.write_text('[instances.open]\ndriver = "scripted"\nallow_full_access = true\n')
    first = ServerProcess(database_url, tmp_path / "d", env={"THREADLOOM_PROVIDERS": str(config)}).wait_ready()
    token = first.admin_token
    client = Client(first.url, token)
    try:
        project = (await client.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)}))["createProject"]
        project_id = project["project"]["id"]
        created = await client.gql(
            """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "open",
                 runtimeMode: "full_access"}) { thread { id } userErrors { code } } }""",
            {"p": project_id},
        )
        assert created["createThread"]["userErrors"] == []
        thread_id = created["createThread"]["thread"]["id"]
        done = await finished(client, (await send(client, thread_id, "@plan Step one then two"))["run"]["id"])
        assert done["status"] == "COMPLETED"
        plans = await client.gql("query($r: ID!) { run(id: $r) { plans { id } } }", {"r": done["id"]})
        plan_id = plans["run"]["plans"][0]["id"]
    finally:
        await client.aclose()
        first.stop()

    # The administrator tightens the policy: the instance no longer allows full_access.
    config.write_text('[instances.open]\ndriver = "scripted"\n')
    second = ServerProcess(database_url, tmp_path / "d", env={"THREADLOOM_PROVIDERS": str(config)}).wait_ready()
    client = Client(second.url, token)
    try:
        answer = await client.post(IMPLEMENT, {"p": plan_id})
        body = answer.json()
        refused = body["data"]["implementPlan"] if body.get("data") else None
        errors = body.get("errors") or (refused or {}).get("userErrors")
        assert errors, body  # the new thread cannot be made: the request is refused
        plan = (await client.gql(PLAN, {"p": plan_id}))["node"]
        assert plan["status"] == "FINALIZED", "a refused implementPlan left the plan IMPLEMENTED with no work"
        threads = (await client.gql(THREADS, {"p": project_id}))["project"]["threads"]["totalCount"]
        assert threads == 1
    finally:
        await client.aclose()
        second.stop()

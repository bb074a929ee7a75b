"""A query operation reads one snapshot: what it returns agrees with itself.

Found by a CI run: a thread showed an approval the agent had asked for next to its run still
STARTING. The turn's start and the request were written in one commit, and the query read the
run just before that commit and the pending requests just after it. These tests pin the
mechanism on the real database: a commit landing between two reads of one query is not seen
by the second, and the schema gives queries (not mutations) that snapshot.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from tests.support.graphql import workspace
from threadloom.api.context import Context
from threadloom.api.ids import encode
from threadloom.api.schema import build_schema
from threadloom.domain.access import Principal
from threadloom.domain.statuses import TokenScope
from threadloom.engine.services import Services
from threadloom.store import tables as t
from threadloom.store.db import StatementCounter

ADMIN = Principal(uuid.uuid4(), TokenScope.ADMIN, None)


async def _thread(services: Services) -> tuple[uuid.UUID, uuid.UUID]:
    project = await services.catalog.create_project(ADMIN, name="before", workspace_root=workspace(), key=None)
    thread = await services.catalog.create_thread(
        ADMIN,
        project_id=project,
        title="T",
        provider_instance_id=None,
        model=None,
        runtime_mode="workspace_write",
        key=None,
    )
    return project, thread


async def _rename_project(services: Services, project: uuid.UUID, name: str) -> None:
    async with services.db.transaction() as db:  # another connection's commit, between the reads
        await db.execute(sa.update(t.projects).where(t.projects.c.id == project).values(name=name))


async def test_a_commit_between_two_reads_is_not_seen_by_the_second(services: Services) -> None:
    project, thread = await _thread(services)
    context = Context.create(ADMIN, services)
    snapshot = context.loaders.snapshot()
    try:
        assert (await context.loaders.rows(t.threads).load(thread))["title"] == "T"  # opens the snapshot
        await _rename_project(services, project, "after")
        seen = await context.loaders.rows(t.projects).load(project)
        assert seen["name"] == "before"  # as it was when the query's first read ran
    finally:
        await snapshot.close()
    later = Context.create(ADMIN, services)  # the next operation sees the commit
    assert (await later.loaders.rows(t.projects).load(project))["name"] == "after"
    with pytest.raises(RuntimeError, match="closed"):
        async with snapshot.reader():
            pass


async def test_without_a_snapshot_each_read_sees_the_latest_commit(services: Services) -> None:
    """The control: a mutation's payload is read this way, after its command committed."""
    project, thread = await _thread(services)
    context = Context.create(ADMIN, services)
    await context.loaders.rows(t.threads).load(thread)
    await _rename_project(services, project, "after")
    assert (await context.loaders.rows(t.projects).load(project))["name"] == "after"


async def test_queries_read_in_one_transaction_and_mutations_in_none(services: Services) -> None:
    _, thread = await _thread(services)
    schema = build_schema()
    query = """query($t: ID!) { thread(id: $t) { title project { name }
      runs(first: 5) { totalCount } messages(first: 5) { edges { node { text } } } } }"""
    counter = StatementCounter()
    result = await schema.execute(
        query,
        variable_values={"t": encode("Thread", thread)},
        context_value=Context.create(ADMIN, services, counter=counter),
    )
    assert result.errors is None and result.data is not None
    assert result.data["thread"]["project"]["name"] == "before"
    assert counter.statements >= 3 and counter.transactions == 1  # several reads, one snapshot
    rename = """mutation($t: ID!) { renameThread(input: {threadId: $t, title: "R"}) { thread { title } } }"""
    counter = StatementCounter()
    result = await schema.execute(
        rename,
        variable_values={"t": encode("Thread", thread)},
        context_value=Context.create(ADMIN, services, counter=counter),
    )
    assert result.errors is None and result.data is not None
    assert result.data["renameThread"]["thread"]["title"] == "R"  # the payload sees its own commit
    assert counter.transactions == 0

"""A query operation reads one snapshot: what it returns agrees with itself.

Found by a CI run: a thread showed an approval the agent had asked for next to its run still
STARTING. The turn's start and the request were written in one commit, and the query read the
run just before that commit and the pending requests just after it. These tests pin the
mechanism on the real database: a commit landing between two reads of one query is not seen
by the second, and the schema gives queries (not mutations) that snapshot.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from tests.support.inproc import ADMIN, new_thread, send
from threadloom.api.context import Context
from threadloom.api.ids import encode
from threadloom.api.schema import build_schema
from threadloom.engine.services import Services
from threadloom.store import reads
from threadloom.store import tables as t
from threadloom.store.db import StatementCounter


async def _thread(services: Services, root: Path) -> tuple[uuid.UUID, uuid.UUID]:
    """(project, thread) of a new thread; its project is named "p"."""
    thread = await new_thread(services, root)
    async with services.db.read() as db:
        project = await db.scalar(sa.select(t.threads.c.project_id).where(t.threads.c.id == thread))
    return project, thread


async def _execute(services: Services, document: str, thread: uuid.UUID) -> tuple[dict[str, Any], StatementCounter]:
    counter = StatementCounter()
    context = Context.create(ADMIN, services, counter=counter)
    variables = {"t": encode("Thread", thread)}
    result = await build_schema().execute(document, variable_values=variables, context_value=context)
    assert result.errors is None and result.data is not None
    return result.data, counter


async def _rename_project(services: Services, project: uuid.UUID, name: str) -> None:
    async with services.db.transaction() as db:  # another connection's commit, between the reads
        await db.execute(sa.update(t.projects).where(t.projects.c.id == project).values(name=name))


async def test_a_commit_between_two_reads_is_not_seen_by_the_second(services: Services, tmp_path: Path) -> None:
    project, thread = await _thread(services, tmp_path / "ws")
    context = Context.create(ADMIN, services)
    snapshot = context.loaders.snapshot()
    try:
        assert (await context.loaders.rows(t.threads).load(thread))["title"] == "t"  # opens the snapshot
        await _rename_project(services, project, "after")
        seen = await context.loaders.rows(t.projects).load(project)
        assert seen["name"] == "p"  # as it was when the query's first read ran
    finally:
        await snapshot.close()
    later = Context.create(ADMIN, services)  # the next operation sees the commit
    assert (await later.loaders.rows(t.projects).load(project))["name"] == "after"
    with pytest.raises(RuntimeError, match="closed"):
        async with snapshot.reader():
            pass


async def test_without_a_snapshot_each_read_sees_the_latest_commit(services: Services, tmp_path: Path) -> None:
    """The control: a mutation's payload is read this way, after its command committed."""
    project, thread = await _thread(services, tmp_path / "ws")
    context = Context.create(ADMIN, services)
    await context.loaders.rows(t.threads).load(thread)
    await _rename_project(services, project, "after")
    assert (await context.loaders.rows(t.projects).load(project))["name"] == "after"


async def test_queries_read_in_one_transaction_and_mutations_in_none(services: Services, tmp_path: Path) -> None:
    _, thread = await _thread(services, tmp_path / "ws")
    query = """query($t: ID!) { thread(id: $t) { title project { name }
      runs(first: 5) { totalCount } messages(first: 5) { edges { node { text } } } } }"""
    data, counter = await _execute(services, query, thread)
    assert data["thread"]["project"]["name"] == "p"
    assert counter.statements >= 3 and counter.transactions == 1  # several reads, one snapshot
    rename = """mutation($t: ID!) { renameThread(input: {threadId: $t, title: "R"}) { thread { title } } }"""
    data, counter = await _execute(services, rename, thread)
    assert data["renameThread"]["thread"]["title"] == "R"  # the payload sees its own commit
    assert counter.transactions == 0


async def test_direct_reads_give_what_sqlalchemy_gives(services: Services, tmp_path: Path) -> None:
    """Outside SQLAlchemy's transactions `Reader.dicts` and `tuples` run a plain select on the
    asyncpg connection itself: for every projection (UUIDs, timestamps, enums as text, JSON,
    arrays) and a windowed page, the rows are the ones SQLAlchemy's execution gives, and each
    counts as one statement."""
    _, thread = await _thread(services, tmp_path / "ws")
    await send(services, thread, "hello")  # a run, a message, their events and activities
    counter = StatementCounter()
    async with services.db.statements(counter) as db:
        for table in t.PROJECTIONS.values():
            stmt = sa.select(table).order_by(table.c.id)
            through = (await db.execute(stmt)).all()
            for _ in range(2):  # a statement object is compiled for the driver when it is run again
                assert await db.tuples(stmt) == [tuple(r) for r in through], table.name
                assert await db.dicts(stmt) == [dict(r._mapping) for r in through], table.name
        page = reads._page_statement(t.threads, "id", "project_id", reads.PageArgs(first=5), [])
        params = {"page_limit": 6, "page_parents": [uuid.uuid4(), *(await db.scalars_all(sa.select(t.projects.c.id)))]}
        through = [dict(r) for r in (await db.execute(page, params)).mappings().all()]
        for _ in range(2):
            assert through and await db.dicts(page, params) == through
        assert await db._fetch_direct(page, params) is not None  # the direct path really ran
        assert await db._fetch_direct(sa.select(t.projects), None) is None  # built for one call: SQLAlchemy's
    assert counter.statements == 5 * len(t.PROJECTIONS) + 2 + 3
    async with services.db.read() as db:  # never inside SQLAlchemy's own (lazily begun) transaction
        assert await db._fetch_direct(page, params) is None
    async with services.db.transaction() as db:  # the driver's, begun first: direct reads run inside it
        assert await db._fetch_direct(page, params) is not None


async def test_direct_statements_run_inside_the_transaction(services: Services, tmp_path: Path) -> None:
    """A `transaction()` is begun on the driver before its first statement, so a text statement run
    straight on the driver (a single row, a scalar, a write returning rows) sees the transaction's own
    writes and is undone with it; the values are the ones SQLAlchemy's execution gives."""
    project, _ = await _thread(services, tmp_path / "ws")
    rename = sa.text("UPDATE projects SET name = :name WHERE id = :id RETURNING id, name, created_at")
    read = sa.text("SELECT name, created_at, id FROM projects WHERE id = :id")
    name = sa.text("SELECT name FROM projects WHERE id = :id")
    with pytest.raises(RuntimeError, match="undo"):
        async with services.db.transaction() as db:
            through = (await db.execute(read, {"id": project})).mappings().one()
            for _ in range(2):  # compiled for the driver when run again
                assert await db.one_or_none(read, {"id": project}) == dict(through)
            assert await db._fetch_direct(read, {"id": project}) is not None
            await db.one_or_none(rename, {"name": "first", "id": project})
            renamed = await db.one_or_none(rename, {"name": "inside", "id": project})
            assert renamed is not None and renamed["name"] == "inside"
            await db.scalar(name, {"id": project})
            assert await db.scalar(name, {"id": project}) == "inside"  # its own write, read directly
            assert await db._fetch_direct(name, {"id": project}) is not None
            raise RuntimeError("undo")
    async with services.db.statements() as db:
        assert await db.scalar(name, {"id": project}) == "p"  # rolled back with the transaction
        # typed parameters get SQLAlchemy's processing, an expanding one's values too
        typed = sa.text("SELECT CAST(:doc AS jsonb) AS doc WHERE CAST(:doc AS jsonb) IN :docs").bindparams(
            sa.bindparam("doc", type_=JSONB()), sa.bindparam("docs", expanding=True, type_=JSONB())
        )
        params = {"doc": {"a": [1]}, "docs": [{"b": 2}, {"a": [1]}]}
        through = (await db.execute(typed, params)).mappings().one()
        for _ in range(2):
            assert await db.one_or_none(typed, params) == dict(through) == {"doc": {"a": [1]}}
        assert await db._fetch_direct(typed, params) is not None
    async with services.db.transaction() as db:
        await db.one_or_none(rename, {"name": "kept", "id": project})
    async with services.db.statements() as db:
        assert await db.scalar(name, {"id": project}) == "kept"


async def test_a_statement_read_again_stays_direct_however_many_one_off_statements_pass(services: Services) -> None:
    """The direct path remembers at most 512 statements. One-off statements (built per call, each met once) are
    what is forgotten when it is full; a statement its module keeps and runs again stays direct. Clearing it
    all sent a hot read back through SQLAlchemy (and made a check of the direct path fail at random)."""
    hot = sa.select(t.projects.c.id, t.projects.c.name).where(t.projects.c.id == sa.bindparam("id"))
    async with services.db.statements() as db:
        for _ in range(2):
            await db.tuples(hot, {"id": uuid.uuid4()})
        assert await db._fetch_direct(hot, {"id": uuid.uuid4()}) is not None
        one_offs = [sa.select(t.projects.c.id).where(t.projects.c.name == f"p{n}") for n in range(600)]
        for stmt in one_offs:
            await db.tuples(stmt)
        assert await db._fetch_direct(hot, {"id": uuid.uuid4()}) is not None  # still direct after 600 one-offs
        again = one_offs[-1]  # the twin: a one-off met a second time is compiled for the driver too
        await db.tuples(again)
        assert await db._fetch_direct(again, None) is not None


async def test_a_snapshot_holds_for_reads_through_sqlalchemy_too(services: Services, tmp_path: Path) -> None:
    """The snapshot is the driver's transaction: statements SQLAlchemy runs on its connection (a
    count, a feed cursor) see the same commit as the direct reads."""
    project, thread = await _thread(services, tmp_path / "ws")
    context = Context.create(ADMIN, services)
    snapshot = context.loaders.snapshot()
    try:
        assert (await context.loaders.rows(t.threads).load(thread))["title"] == "t"  # direct: opens it
        await _rename_project(services, project, "after")
        async with context.loaders.reader() as db:
            assert await db.scalar(sa.select(t.projects.c.name).where(t.projects.c.id == project)) == "p"
    finally:
        await snapshot.close()

"""Engine creation and the statement counter used for observability.

All SQL goes through `Database`. Each request gets a `StatementCounter` so the API can
report (and tests can assert) how many statements a page cost.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from threadloom import io_guard, tracing


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def make_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=False,
        json_serializer=_json_dumps,
        json_deserializer=orjson.loads,
    )
    tracing.instrument_engine(engine)  # a span per statement, while tracing is on
    return engine


@dataclasses.dataclass(slots=True)
class StatementCounter:
    statements: int = 0
    transactions: int = 0


class Database:
    """One engine per process. `read()` and `transaction()` hand out connections."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        # The same pool; a connection checked out through it runs without BEGIN/ROLLBACK.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    @classmethod
    def from_url(cls, url: str, *, pool_size: int = 10) -> Database:
        return cls(make_engine(url, pool_size=pool_size))

    @asynccontextmanager
    async def read(self, counter: StatementCounter | None = None) -> AsyncIterator[Reader]:
        async with _pooled(self.engine) as conn:
            yield Reader(conn, counter or StatementCounter())

    @asynccontextmanager
    async def statements(self, counter: StatementCounter | None = None) -> AsyncIterator[Reader]:
        """A connection outside any transaction: each statement is its own.

        For the API's reads (a token check, a loader's batch) and the engine's one-statement reads.
        `read()` costs a BEGIN and a ROLLBACK round trip around them and gives nothing more: under
        READ COMMITTED every statement of a transaction takes its own snapshot anyway. Not for
        anything that writes, locks or needs `now()` to agree across statements.
        """
        async with _pooled(self._autocommit) as conn:
            yield Reader(conn, counter or StatementCounter(), direct=True)

    @asynccontextmanager
    async def transaction(self, counter: StatementCounter | None = None) -> AsyncIterator[Reader]:
        """A READ COMMITTED transaction, committed when the block ends and rolled back if it raises.

        It is the driver's own (asyncpg's BEGIN and COMMIT on a connection checked out in autocommit
        mode, as `Snapshot`'s), begun before the first statement: its statements may then run straight
        on the driver (`Reader._fetch_direct`), which SQLAlchemy's lazily begun transaction would not
        allow. Statements run through SQLAlchemy run inside it all the same. The task is marked as inside a
        transaction meanwhile: a git or agent call in it is counted, or refused under the test suite's
        strict flag (`threadloom.io_guard`)."""
        c = counter or StatementCounter()
        async with _pooled(self._autocommit) as conn:
            driver, transaction = await _begin(conn)
            c.transactions += 1
            with io_guard.transaction_open():  # no git or agent call until it ends (`threadloom.io_guard`)
                try:
                    yield Reader(conn, c, driver, direct=True)
                except Exception:
                    try:
                        await transaction.rollback()
                    except BaseException:
                        await conn.invalidate()  # a connection in an unknown state goes, not back to the pool
                    raise
                try:
                    await transaction.commit()
                except BaseException:
                    await conn.invalidate()
                    raise

    def snapshot(self, counter: StatementCounter | None = None) -> Snapshot:
        """Reads that all see the database at one moment (opened at the first of them)."""
        return Snapshot(self._autocommit, counter or StatementCounter())

    async def dispose(self) -> None:
        await self.engine.dispose()


@asynccontextmanager
async def _pooled(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection of the pool that goes back to it only if its user ended normally or with an ordinary error.

    A user stopped by a cancellation (a subscription ended by its client while a loader read, a query past its
    timeout) may have been stopped halfway through the protocol, and the session's next user inherited that:
    - asyncpg prepares a statement (Parse, Describe, Flush) before it binds and runs it (Bind, Execute, Sync).
      Cancelled as its prepare answered, it left the server in an implicit transaction holding a snapshot while
      asyncpg believed the session idle: a query's `BEGIN ISOLATION LEVEL REPEATABLE READ` then failed ("must be
      called before any query"), an internal error for the client. Seen in CI.
    - SQLAlchemy records its lazy BEGIN only once it answered. Cancelled as it answered, asyncpg kept it as the
      connection's top transaction with none to roll it back: the next `transaction()` became a savepoint, and
      its COMMIT released the savepoint without committing anything.
    So such a connection is closed instead (the server rolls back what it held). Cancellations are rare next to
    the reconnect this costs."""
    async with engine.connect() as conn:
        try:
            yield conn
        except Exception:
            raise
        except BaseException:
            await conn.invalidate()
            raise


async def _begin(conn: AsyncConnection, **options: Any) -> tuple[Any, Any]:
    """The asyncpg connection under `conn` (checked out in autocommit mode) and a transaction begun on it.
    If beginning fails the connection is dropped, not returned to the pool: it may or may not be in one."""
    try:
        driver: Any = (await conn.get_raw_connection()).driver_connection
        transaction = driver.transaction(**options)
        await transaction.start()
    except BaseException:
        await conn.invalidate()
        raise
    return driver, transaction


class Snapshot:
    """One REPEATABLE READ, READ ONLY transaction shared by the reads of one query operation.

    Separate statements under READ COMMITTED each see the latest commit: a query reading a run
    and then its pending requests could show an approval the agent asked for next to the run
    as it was before the agent's turn started, written in the same commit. Here every read of
    the operation sees the same commit. The transaction opens lazily (an operation that reads
    nothing costs nothing), its reads take turns on the one connection, and `close` ends it.

    The transaction is the driver's own (asyncpg's BEGIN and ROLLBACK, on a connection checked
    out in autocommit mode so SQLAlchemy starts none of its own): SQLAlchemy's transaction
    handling cost more CPU than both round trips. Statements run through SQLAlchemy on this
    connection run inside it all the same.
    """

    def __init__(self, engine: AsyncEngine, counter: StatementCounter) -> None:
        self._engine = engine  # in autocommit mode (`Database._autocommit`)
        self._counter = counter
        self._conn: AsyncConnection | None = None
        self._driver: Any = None
        self._transaction: Any = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._interrupted = False

    @asynccontextmanager
    async def reader(self) -> AsyncIterator[Reader]:
        async with self._lock:
            if self._closed:
                raise RuntimeError("the operation's snapshot is closed")
            if self._conn is None:
                conn = await self._engine.connect()
                driver, transaction = await _begin(conn, isolation="repeatable_read", readonly=True)
                self._conn, self._driver, self._transaction = conn, driver, transaction
                self._counter.transactions += 1
            try:
                yield Reader(self._conn, self._counter, self._driver, direct=True)
            except Exception:
                raise
            except BaseException:
                self._interrupted = True  # the connection is closed, not pooled (`_pooled`)
                raise

    async def close(self) -> None:
        """End the transaction and return the connection (after a read still running, if any)."""
        async with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is None:
                return
            try:
                if self._interrupted:
                    await conn.invalidate()
                else:
                    await self._transaction.rollback()  # read only: nothing to commit
                await conn.close()
            except BaseException:
                await conn.invalidate()
                raise


class Reader:
    """A connection that counts what it executes."""

    def __init__(
        self, conn: AsyncConnection, counter: StatementCounter, driver: Any = None, direct: bool = False
    ) -> None:
        self.conn = conn
        self.counter = counter
        self._driver = driver  # the asyncpg connection under `conn`, once asked for
        # Whether plain statements may skip SQLAlchemy (`_fetch_direct`): only where SQLAlchemy holds no
        # transaction of its own (autocommit, or the driver's transaction of a snapshot or of
        # `transaction()`), since one run straight on the driver before SQLAlchemy's lazy BEGIN would
        # run outside that transaction.
        self._direct = direct

    async def execute(self, stmt: sa.Executable, params: Any = None) -> sa.CursorResult[Any]:
        self.counter.statements += 1
        return await self.conn.execute(stmt, params)

    async def rows(self, stmt: sa.Executable, params: Any = None) -> list[sa.RowMapping]:
        result = await self.execute(stmt, params)
        return list(result.mappings().all())

    async def dicts(self, stmt: sa.Executable, params: Any = None) -> list[dict[str, Any]]:
        """Rows as plain dicts: cheaper to build and to read than RowMappings, for pages of many rows."""
        records = await self._fetch_direct(stmt, params)
        if records is not None:
            keys = list(records[0].keys()) if records else []
            return [dict(zip(keys, record, strict=True)) for record in records]  # a third faster than dict(record)
        result = await self.execute(stmt, params)
        keys = list(result.keys())
        return [dict(zip(keys, row, strict=True)) for row in result.all()]

    async def tuples(self, stmt: sa.Executable, params: Any = None) -> list[tuple[Any, ...]]:
        """Rows as plain tuples in select order: the cheapest shape for hot paths that build their own objects."""
        records = await self._fetch_direct(stmt, params)
        if records is not None:
            return [tuple(record) for record in records]
        result = await self.execute(stmt, params)
        return [tuple(row) for row in result.all()]

    async def _fetch_direct(self, stmt: sa.Executable, params: Any) -> list[Any] | None:
        """The records of a select whose columns SQLAlchemy would not convert, or of a text statement,
        run straight on the asyncpg connection (`_direct`), or None when SQLAlchemy must run it.

        SQLAlchemy's execution of a page's read (its cache key, parameter and result handling, the
        greenlet hop) cost about twice the statement's own CPU. While tracing is on every statement
        goes through SQLAlchemy, which reports it.
        """
        compiled = _direct(stmt, self.conn.dialect) if self._direct and not tracing.ENABLED else None
        if compiled is None:
            return None
        state = compiled.construct_expanded_state(params or {})
        processors = compiled._bind_processors
        if state.processors:  # an expanding (IN) parameter's, one per expanded value
            processors = {**processors, **state.processors}
        values = state.parameters
        args = [processors[k](values[k]) if k in processors else values[k] for k in state.positiontup or ()]
        driver = self._driver
        if driver is None:
            driver = self._driver = (await self.conn.get_raw_connection()).driver_connection
        self.counter.statements += 1
        return await driver.fetch(state.statement, *args)  # type: ignore[no-any-return]

    async def one_or_none(self, stmt: sa.Executable, params: Any = None) -> Mapping[str, Any] | None:
        records = await self._fetch_direct(stmt, params)
        if records is not None:
            if len(records) > 1:
                raise sa.exc.MultipleResultsFound("multiple rows were found when one or none was required")
            return dict(zip(records[0].keys(), records[0], strict=True)) if records else None
        result = await self.execute(stmt, params)
        return cast("Mapping[str, Any] | None", result.mappings().one_or_none())  # its keys are names

    async def scalars_all(self, stmt: sa.Executable, params: Any = None) -> list[Any]:
        result = await self.execute(stmt, params)
        return list(result.scalars().all())

    async def scalar(self, stmt: sa.Executable, params: Any = None) -> Any:
        records = await self._fetch_direct(stmt, params)
        if records is not None:
            return records[0][0] if records else None
        result = await self.execute(stmt, params)
        return result.scalar()


# Selects compiled once for `Reader._fetch_direct`, by statement: its compiled form, None (through
# SQLAlchemy), or _SEEN (met once so far).
_DIRECT: dict[int, tuple[sa.Executable, Any]] = {}
_SEEN = object()


def _direct(stmt: sa.Executable, dialect: Any) -> Any:
    """`stmt` compiled for the asyncpg connection, or None when SQLAlchemy runs it: neither a select nor
    a text statement (whose result columns are untyped: SQLAlchemy hands on the driver's values), a
    select column whose values SQLAlchemy converts (asyncpg's own codecs give every other value as SQLAlchemy
    would, JSON included: the dialect sets the driver's JSON codecs), or a statement object met for the
    first time. Only a statement run again (one its module keeps, such as a page's or a by-id read) is
    compiled here: one built for a single call is better served by SQLAlchemy's cache of compiled forms,
    which finds it by structure."""
    found = _DIRECT.get(id(stmt))
    if found is None or found[0] is not stmt:
        if len(_DIRECT) >= 512:
            _forget_one_offs()
        _DIRECT[id(stmt)] = (stmt, _SEEN)  # holds `stmt`, so its id is not reused
        return None
    if found[1] is not _SEEN:
        return found[1]
    compiled = None
    if dialect.driver == "asyncpg" and dialect.paramstyle == "numeric_dollar":
        if isinstance(stmt, sa.TextClause):
            compiled = stmt.compile(dialect=dialect)
        elif isinstance(stmt, sa.Select):
            types = [c.type for c in stmt.selected_columns]
            # A numeric's processor depends on the column's actual type, known only from the cursor.
            if not any(isinstance(k, sa.Numeric | sa.Float) for k in types) and all(
                k.dialect_impl(dialect).result_processor(dialect, None) is None for k in types
            ):
                compiled = stmt.compile(dialect=dialect)
    _DIRECT[id(stmt)] = (stmt, compiled)
    return compiled


def _forget_one_offs() -> None:
    """Room in `_DIRECT`. Statements built per call fill it, each met once: those go. A statement met again keeps
    its decision, so the hot reads stay direct however many one-offs pass (clearing it all sent them back through
    SQLAlchemy twice after every 512 one-offs). Only when statements met again fill it on their own is it cleared."""
    for key in [key for key, (_, decided) in _DIRECT.items() if decided is _SEEN]:
        del _DIRECT[key]
    if len(_DIRECT) >= 512:
        _DIRECT.clear()

"""No git or agent call while a database write transaction is open.

A command's transaction holds its thread's row lock and a pooled connection until it commits: git
walking a workspace or an agent answering inside it holds every other command on that thread (and
the connection) for as long, and a crash between the call and the commit leaves the files or the
agent ahead of the log. So commands decide and commit, and the work runs after (effects) or before.

`store.db.Database.transaction` marks the task as inside a transaction (`transaction_open`); the one
place every git call starts (`checkpoints.git.Git.launch`) and every agent call goes out
(`providers.child_process`: a spawn or a message written to the agent) calls `check`. In production
a call inside a transaction is counted in `threadloom_io_in_transaction_total{kind}` and logged once
per kind; with `THREADLOOM_STRICT_TRANSACTIONS=1` (set by the test suite only) it raises
`IoInTransaction`, so the test that takes such a path fails where the call is made.

A leaf module like `metrics`: every layer may import it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator

from threadloom import metrics

STRICT_ENV = "THREADLOOM_STRICT_TRANSACTIONS"
log = logging.getLogger("threadloom.io_guard")


class IoInTransaction(RuntimeError):
    """A git or agent call inside a database transaction, under `THREADLOOM_STRICT_TRANSACTIONS=1`."""


class _Mark:
    """One open transaction. Tasks started inside it copy the context (and this object): once the
    transaction ends it is closed for them too, so a task that outlives it is not taken as inside."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = True


_transaction: contextvars.ContextVar[_Mark | None] = contextvars.ContextVar("threadloom_transaction", default=None)
_allowed: contextvars.ContextVar[str | None] = contextvars.ContextVar("threadloom_io_allowed", default=None)
_logged: set[str] = set()


@contextlib.contextmanager
def transaction_open() -> Iterator[None]:
    """The current task is inside a write transaction for the block's length."""
    mark = _Mark()
    token = _transaction.set(mark)
    try:
        yield
    finally:
        mark.open = False
        with contextlib.suppress(ValueError):  # closed from another context (a generator finalized late)
            _transaction.reset(token)


@contextlib.contextmanager
def allow_io_in_transaction(reason: str) -> Iterator[None]:
    """A named exception to the rule, for a command not yet moved out of its transaction: calls made in
    the block are neither counted nor refused. Each use is a debt: the reason names who removes it."""
    token = _allowed.set(reason)
    try:
        yield
    finally:
        _allowed.reset(token)


def inside_transaction() -> bool:
    mark = _transaction.get()
    return mark is not None and mark.open


def check(kind: str) -> None:
    """Called before a git (`kind="git"`) or agent (`kind="agent"`) call: count it (and raise, when
    strict) if the task is inside a database transaction without an allowance."""
    if not inside_transaction() or _allowed.get() is not None:
        return
    metrics.IO_IN_TRANSACTION.labels(kind).inc()
    if os.environ.get(STRICT_ENV) == "1":
        raise IoInTransaction(f"a {kind} call inside a database transaction")
    if kind not in _logged:
        _logged.add(kind)
        log.warning("a %s call inside a database transaction (logged once per kind)", kind, stack_info=True)

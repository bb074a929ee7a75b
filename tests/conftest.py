"""Shared fixtures: real embedded PostgreSQL, fresh database per test, real servers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support import slow_files, tree_cpu
from tests.support.fake_model import FakeModel
from tests.support.graphql import workspace as workspace_folder
from tests.support.pg import PgServer, postgres_servers
from tests.support.schedule import LongestFirst
from tests.support.server import Client, ServerProcess, providers_env, serving
from tests.support.spare import ServerPool, Spare, Wanted
from threadloom import unprivileged
from threadloom.config import Settings
from threadloom.engine.clock import SystemClock
from threadloom.engine.services import Services
from threadloom.providers.registry import load_instances
from threadloom.store.db import Database


@pytest.fixture(scope="session", autouse=True)
def no_postgres_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """At the end of the session, stop every embedded server a test's `threadloom serve` left
    under the session's temp folder (a test that failed before stopping its server)."""
    yield
    base = tmp_path_factory.getbasetemp().resolve()
    for pid, pgdata in postgres_servers().items():
        if pgdata.is_relative_to(base):
            os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown


_OWN_BASE = "threadloom-pytest-"
_TIMES = os.environ.get("THREADLOOM_TEST_TIMES")
_tree_cpu: tree_cpu.TreeCpu | None = None  # this test process's group, when THREADLOOM_TEST_TIMES asks for times


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Agents run as an unprivileged user when the tests run as root (threadloom.unprivileged), and pytest's
    own temp root (/tmp/pytest-of-root) is 0700 -- made so again by every pytest session that starts, so it
    cannot be loosened once. A root session without --basetemp gets a base of its own in /tmp instead."""
    config.addinivalue_line("markers", "own_server: in a SHARED_SERVER module, a fresh server for this test only")
    global _tree_cpu
    if _TIMES and _tree_cpu is None and (hasattr(config, "workerinput") or not config.getoption("numprocesses", None)):
        _tree_cpu = tree_cpu.enter()  # before this process starts anything (xdist's controller runs no test)
    if os.geteuid() != 0:
        return
    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix=_OWN_BASE)
    # Every temp folder a test or fixture makes (`tmp_path`, `tmp_path_factory.mktemp`) is made 0700 too:
    # traversable (0711) instead, so a data dir or workspace made in one is within the agent user's reach.
    mktemp = pytest.TempPathFactory.mktemp
    if not getattr(mktemp, "reachable", False):

        def reachable_mktemp(self: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
            path = mktemp(self, basename, numbered)
            path.chmod(0o711)
            return path

        reachable_mktemp.reachable = True  # type: ignore[attr-defined]
        pytest.TempPathFactory.mktemp = reachable_mktemp  # type: ignore[method-assign]


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (the app, strawberry, hypothesis, schemathesis: ~380,000 objects) lives until the
    end: frozen, the garbage collector's full passes stop walking it. A full pass over it took ~0.24 s, and a
    worker made ~13-21 full passes in a run (4.5-8.6 s of its CPU)."""
    gc.collect()
    gc.freeze()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist each worker's base is a folder in this (the controller's) base: it must be traversable too."""
    if os.geteuid() == 0 and not hasattr(session.config, "workerinput"):
        session.config._tmp_path_factory.getbasetemp().chmod(0o711)  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    """The base made by pytest_configure: no pytest session cleans it up (a worker's is inside it)."""
    if _tree_cpu is not None:
        _tree_cpu.leave()
    if os.geteuid() == 0 and not hasattr(config, "workerinput") and config.option.basetemp is not None:
        base = Path(config.option.basetemp)
        if base.name.startswith(_OWN_BASE):
            _remove_in_background(base)


@pytest.fixture(autouse=True)
def agent_user_reaches_tmp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    """pytest's temp folders are 0700, so the agent user could not even reach the workspaces made in them.
    The session's base and the test's folder (when it uses one) become traversable (0711), never listable;
    nothing in src is loosened for tests."""
    base = tmp_path_factory.getbasetemp()
    base.chmod(0o711)
    if "tmp_path" in request.fixturenames:
        request.getfixturevalue("tmp_path").chmod(0o711)


@pytest.fixture(autouse=True)
def agent_user_setting_per_test() -> Iterator[None]:
    """`Services.build` sets the agent user for the whole process (`threadloom.unprivileged.configure`): kept
    to the test that built it, so a driver test after it in the same session starts its agents as before."""
    saved = unprivileged._current
    yield
    unprivileged._current = saved


def _remove_in_background(folder: Path) -> None:
    """A full run leaves gigabytes of databases: removed by a process of their own, not while the run waits."""
    argv = ["rm", "-rf", str(folder)]
    subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_GIB = 1 << 30


def _pg_parent() -> str | None:
    """Where the session's PostgreSQL keeps its data: THREADLOOM_TEST_PG_DIR, else /dev/shm (memory) when it has
    room, else the temp folder.

    A full run clones the template database ~700 times (a few GB written for both workers, never read back).
    On a disk that was kernel time and about a minute of I/O wait on the 2-core machine, for data deleted at the
    end; in memory neither. A run held at most ~4 GB there, so /dev/shm is taken only with 8 GB free in it and
    12 GB of memory available."""
    chosen = os.environ.get("THREADLOOM_TEST_PG_DIR")
    if chosen:
        return chosen
    try:
        shm = os.statvfs("/dev/shm")
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    available = next((int(row.split()[1]) << 10 for row in meminfo.splitlines() if row.startswith("MemAvailable:")), 0)
    roomy = shm.f_bavail * shm.f_frsize >= 8 * _GIB and available >= 12 * _GIB
    return "/dev/shm" if roomy and os.access("/dev/shm", os.W_OK | os.X_OK) else None


@pytest.fixture(scope="session")
async def pg() -> AsyncIterator[PgServer]:
    """A private embedded PostgreSQL per test session, so parallel sessions never meet."""
    root = Path(tempfile.mkdtemp(prefix="threadloom-tests-", dir=_pg_parent()))
    server = PgServer(root / "pg")
    await server.create_template()
    yield server
    server.stop()
    _remove_in_background(root)


@pytest.fixture(scope="session")
def server_pool(pg: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    pool = ServerPool(pg, tmp_path_factory)
    yield pool
    pool.close()


_OWN_SERVER = ("server", "database_url", "data_dir")
_NEXT = pytest.StashKey["pytest.Item | None"]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> LongestFirst | None:
    """`--dist loadfile` (scripts/test) hands out the longest files first and splits long files whose tests
    share no fixture (tests/support/schedule.py)."""
    return LongestFirst(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With THREADLOOM_TEST_TIMES=<file>, each test's wall time (setup, call and teardown) is appended to it,
    the input of `python -m tests.support.slow_files` (the table the scheduler orders by), and where it can be
    measured the CPU the test process and all it started used meanwhile (tests/support/tree_cpu.py)."""
    if _TIMES and not hasattr(report, "node"):  # in the process that ran it, not again in xdist's controller
        slow_files.record(_TIMES, report, _tree_cpu.since_last() if _tree_cpu is not None else None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Each test learns the one after it, so a server is started ahead only for a test that will use it."""
    item.stash[_NEXT] = nextitem


def _server_wanted(item: pytest.Item | None) -> Wanted | None:
    """Whether `item` takes conftest's `server` fixture (a module that starts its own server, or owns its
    database, is left to do so), and with which provider instances."""
    if item is None or "server" not in getattr(item, "fixturenames", ()):
        return None
    module = getattr(item, "module", None)
    if any(hasattr(module, name) for name in _OWN_SERVER) or _shares_a_server(item):
        return None
    providers = getattr(module, "PROVIDERS", None)
    return Wanted(providers if isinstance(providers, str) else None)


@pytest.fixture(autouse=True)
def spare(request: pytest.FixtureRequest) -> Spare | None:
    """The server started ahead for this test when it takes `server` (tests/support/spare.py); and the next
    test's, started now, when that one will."""
    now = _server_wanted(request.node)  # type: ignore[arg-type]
    ahead = _server_wanted(request.node.stash.get(_NEXT, None))
    if now is None and ahead is None:
        return None
    pool: ServerPool = request.getfixturevalue("server_pool")
    return pool.take(now, ahead)


def _shares_a_server(node: object) -> bool:
    """A test in a module that says `SHARED_SERVER = True` uses the module's one server (`module_server`),
    unless it is marked `@pytest.mark.own_server`."""
    if getattr(getattr(node, "module", None), "SHARED_SERVER", False) is not True:
        return False
    marker = getattr(node, "get_closest_marker", None)
    return marker is None or marker("own_server") is None


@pytest.fixture(scope="module")
def module_server_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a module's shared server: its `PROVIDERS` and `SERVER_ENV`. A module whose server
    needs what only exists at run time (the address of a module-scoped fake model server) overrides this
    fixture, module-scoped, with the environment it builds."""
    providers = getattr(request.module, "PROVIDERS", None)
    extra = dict(getattr(request.module, "SERVER_ENV", {}))
    if not isinstance(providers, str):
        return extra
    return providers_env(tmp_path_factory.mktemp("module-providers"), providers, **extra)


@pytest.fixture(scope="module")
def module_server(
    request: pytest.FixtureRequest, pg: PgServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server for a whole module that says `SHARED_SERVER = True`, with its `PROVIDERS` and `SERVER_ENV`
    (`module_server_env`); a module that says `SERVER_EXEC = True` gets the real `python -m threadloom serve`
    rather than a fork of the test's preloaded process (a test that reads the server's own /proc entries).

    A per-test server costs a start (about a second of CPU) and a stop: a module of twenty short tests spent
    more time waiting for servers than testing. Such a module's tests each work in a project of their own
    (their own workspace under `tmp_path`); they never stop the server, nor count rows across projects.

    A test of such a module that needs a server of its own (it stops or kills the server, needs an empty
    database, counts server-wide rows or metrics) says `@pytest.mark.own_server`: its `server`,
    `database_url` and `data_dir` are then a fresh per-test server's, as in a module that shares none (with
    the module's `PROVIDERS`, not its `SERVER_ENV`)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a module fixture may be set up inside a test's loop
        url = pool.submit(asyncio.run, pg.fresh()).result(60)
    folder = tmp_path_factory.mktemp("module-server")
    env = request.getfixturevalue("module_server_env")
    fork = False if getattr(request.module, "SERVER_EXEC", False) is True else None
    with serving(url, folder / "data", env, fork=fork) as proc:
        yield proc


@pytest.fixture
async def database_url(request: pytest.FixtureRequest, pg: PgServer, spare: Spare | None) -> str:
    if _shares_a_server(request.node):
        return str(request.getfixturevalue("module_server").database_url)
    return spare.database_url if spare is not None else await pg.fresh()


@pytest.fixture
def data_dir(request: pytest.FixtureRequest, tmp_path: Path, spare: Spare | None) -> Path:
    if _shares_a_server(request.node):
        return Path(request.getfixturevalue("module_server").data_dir)
    return spare.data_dir if spare is not None else tmp_path / "data"


@pytest.fixture
async def services(
    request: pytest.FixtureRequest,
    pg: PgServer,
    database_url: str,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Services]:
    """In-process services on the test's database; in a module sharing a server, on a database of their own
    (two engines on one database would adopt each other's runs)."""
    monkeypatch.setenv("THREADLOOM_STRICT_TRANSACTIONS", "1")  # as every test server (threadloom.io_guard)
    if _shares_a_server(request.node):
        database_url, data_dir = await pg.fresh(), tmp_path / "services-data"
    settings = Settings.from_env(data_dir=str(data_dir))
    db = Database.from_url(database_url)
    services = Services.build(settings, db, SystemClock(), load_instances(None))
    yield services
    await services.stop()
    await db.dispose()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An existing folder for the test's project (createProject refuses a missing one)."""
    return Path(workspace_folder(tmp_path))


@pytest.fixture
def server(
    request: pytest.FixtureRequest, spare: Spare | None, database_url: str, data_dir: Path
) -> Iterator[ServerProcess]:
    """A real server of its own for the test, started ahead (tests/support/spare.py); a test module's
    `PROVIDERS` (the text of a providers.toml) sets its provider instances. In a module that says
    `SHARED_SERVER = True`, the module's one server."""
    if _shares_a_server(request.node):
        shared: ServerProcess = request.getfixturevalue("module_server")
        since = len(shared.log)
        yield shared
        print(shared.report(since=since))  # this test's part of the log, shown when the test failed
        return
    assert spare is not None and spare.database_url == database_url
    proc = spare.proc.wait_ready()
    yield proc
    proc.stop()
    print(proc.report())  # shown when the test failed


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Client]:
    c = Client(server.url, server.admin_token)
    yield c
    await c.aclose()


@pytest.fixture
def api(client: Client) -> Client:
    """The admin client under the name the scenario tests use."""
    return client


@pytest.fixture
def fake() -> Iterator[FakeModel]:
    """The fake model server the real CLIs talk to (OpenAI Responses and Anthropic Messages)."""
    model = FakeModel().start()
    yield model
    model.stop()


@pytest.fixture(scope="module")
def module_fake() -> Iterator[FakeModel]:
    """One fake model server for a whole module, for the module's own server of real agents (which a
    module-scoped fixture starts once, pointed at it); its tests share the model's requests and hold."""
    model = FakeModel().start()
    yield model
    model.stop()

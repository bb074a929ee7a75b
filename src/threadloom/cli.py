"""The `threadloom` command: serve, migrate, export-schema, token create|list|revoke, acp, providers probe."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import errno
import logging
import math
import os
import re
import signal
import socket
import sys
import traceback
import uuid
import warnings
from collections.abc import Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from threadloom import server_state
from threadloom.api import ids
from threadloom.config import Settings
from threadloom.domain.statuses import TokenScope

T = TypeVar("T")
TOKEN_TYPE = "ApiToken"  # the global id type of a token, as the API names it


class CliError(Exception):
    """An expected failure: printed as one line `threadloom: CODE: message`, exit status 2, no traceback."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors one coded line like every other CLI error (usage stays under --help)."""

    def error(self, message: str) -> Any:
        raise CliError("USAGE", f"{message} (see `{self.prog} --help`)")


def _database_url(settings: Settings) -> tuple[str, Any]:
    """The URL to use and, for the embedded server, its handle (kept alive by the caller)."""
    if settings.database_url:
        url = settings.database_url
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            url = "postgresql+asyncpg://" + url.split("://", 1)[1]
        return url, None
    from threadloom.store.embedded import asyncpg_url, start_embedded

    server = start_embedded(settings.data_dir)
    atexit.register(_stop_embedded_at_exit, server)
    return asyncpg_url(server), server


def _stop_embedded_at_exit(server: Any) -> None:
    """A clean exit (SIGINT and SIGTERM included, see `_exit_on_signal`) stops the embedded
    server unless another live process uses it; after kill -9 it keeps running for reuse."""
    from threadloom.store.embedded import stop_embedded

    for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl+C must not cut the stop short
        signal.signal(sig, signal.SIG_IGN)
    stop_embedded(server)


def _exit_on_signal(signum: int, frame: Any, code: int = 0) -> None:
    """SIGINT/SIGTERM end the process through SystemExit, so exit hooks run.

    uvicorn handles both signals while it serves (graceful shutdown) and then re-raises the
    signal to the handler installed before it: this one. Python's default for SIGTERM
    would end the process without running exit hooks, leaving PostgreSQL behind.
    """
    raise SystemExit(code)


async def _migrate(url: str) -> None:
    from threadloom.store import migrate
    from threadloom.store.db import Database

    db = Database.from_url(url, pool_size=1)
    try:
        await migrate.upgrade(db.engine)
    finally:
        await db.dispose()


async def _prepare(url: str, embedded: bool) -> str | None:
    """Migrate the embedded database (an external one must already be), then on an empty
    token table make the first admin token (under a lock: one process wins)."""
    import sqlalchemy as sa

    from threadloom.engine.clock import SystemClock
    from threadloom.store import migrate, tokens
    from threadloom.store.db import Database

    db = Database.from_url(url, pool_size=1)
    try:
        if embedded:
            await migrate.upgrade(db.engine)
        await migrate.require_migrated(db.engine)
        async with db.transaction() as tx:
            await tx.execute(sa.select(sa.func.pg_advisory_xact_lock(0x746F6B656E)))
            if await tokens.count_tokens(tx) > 0:
                return None
            _, secret = await tokens.create_token(
                tx, name="first admin", scope=TokenScope.ADMIN, project_id=None, now=SystemClock().now()
            )
            return secret
    finally:
        await db.dispose()


def cmd_serve(args: argparse.Namespace) -> int:
    settings = Settings.from_env(host=args.host, port=args.port, data_dir=args.data_dir)
    # The port first (before even the server's imports): a busy one is refused before the database starts, a
    # URL is printed or the one-time admin token is made; uvicorn serves on this socket, so no other process
    # can take the port in between.
    listener = _listen(settings.host, settings.port)

    import uvicorn

    from threadloom import logs
    from threadloom.app import create_app
    from threadloom.providers.registry import ConfigError, load_instances
    from threadloom.store import migrate

    logs.configure(settings.log_level)
    try:
        load_instances(settings.providers_file)
    except ConfigError as error:
        raise CliError("CONFIG_ERROR", str(error)) from None
    signal.signal(signal.SIGINT, _exit_on_signal)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    url, server = _database_url(settings)
    try:
        admin = asyncio.run(_prepare(url, embedded=server is not None))
    except migrate.NotMigrated as error:
        raise CliError("NOT_MIGRATED", str(error)) from None
    base_url = f"http://{settings.host}:{settings.port}"
    if server is not None:
        print(f"Embedded PostgreSQL in {settings.data_dir / 'pg'}", flush=True)
    try:
        announced = f"the CLI finds it through {server_state.write(base_url, settings.data_dir, server is not None)}"
        atexit.register(server_state.remove_if_mine)
    except OSError as error:  # a read-only home: the CLI then needs --data-dir, the server runs all the same
        announced = f"not announced to the CLI: {error}; give it --data-dir"
    print(f"Data dir {settings.data_dir} ({announced})", flush=True)
    print(f"Threadloom: {base_url}/graphql  (dashboard: {base_url}/dashboard/)", flush=True)
    if admin is not None:
        saved = _save_admin_token(settings.data_dir, admin)
        print(f"The admin token is also in {saved} (mode 0600: only its owner can read it)", flush=True)
        print(f"Admin token (shown once, keep it): {admin}", flush=True)
    app = create_app(settings, url)
    # Before uvicorn starts a thread: the validation process is forked now, sharing the imported modules.
    app.state.schema.validation.start(close=(listener.fileno(),))
    for sig in (signal.SIGINT, signal.SIGTERM):  # the exit code: app.WORKER_LOST_EXIT if it stopped itself
        signal.signal(sig, lambda *_: _exit_on_signal(0, None, int(getattr(app.state, "exit_code", 0))))
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        # The HTTP body limit holds for WebSocket messages too: a bigger frame (an unauthenticated
        # connection_init included) is refused by the protocol layer with close code 1009 before
        # any of it is parsed or reaches the application.
        ws_max_size=settings.limits.max_body_bytes,
        # Compressing every small JSON frame costs more CPU on the fan-out path than it saves.
        ws_per_message_deflate=False,
        # What is still open after the going-away items (a command committing, a stream) is cut
        # after this long so a stop cannot hang.
        timeout_graceful_shutdown=max(1, math.ceil(settings.shutdown_seconds - GOING_AWAY_SECONDS)),
        # uvicorn's 5 s equals httpx's pool expiry: a request on a connection idle about that long failed with
        # a read error now and then (the server closed it as the client reused it).
        timeout_keep_alive=max(1, math.ceil(settings.keep_alive_seconds)),
        access_log=False,
        log_config=None,
    )
    _graceful_server(uvicorn.Server, app)(config).run(sockets=[listener])
    return int(getattr(app.state, "exit_code", 0))


def _listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound here so a busy port is one clear line (uvicorn listens on it)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port in TIME_WAIT is free
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        code = "PORT_IN_USE" if error.errno == errno.EADDRINUSE else "PORT_UNAVAILABLE"
        raise CliError(
            code,
            f"cannot listen on {host}:{port}: {error.strerror} (another server?); "
            "stop it or choose another port with --port or THREADLOOM_PORT",
        ) from None
    sock.set_inheritable(True)
    return sock


def _save_admin_token(data_dir: Path, secret: str) -> Path:
    """The first admin token in `<data dir>/admin-token`, 0600 even if the file was there with another mode."""
    path = data_dir / "admin-token"
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)
    return path


GOING_AWAY_SECONDS = 1.0  # how long the subscriptions' last items may take to go out
FORCED_SHUTDOWN_SECONDS = 10.0  # after a second Ctrl-C, how long the app's own shutdown may take


def _graceful_server(base: type[Any], app: Any) -> type[Any]:
    """uvicorn's server, with the going-away step first in its shutdown.

    uvicorn closes every WebSocket at once (code 1012) when it shuts down; before that, the app
    stops taking requests and ends each subscription with SERVER_GOING_AWAY and the cursor to
    resume from, so its client reconnects elsewhere and misses nothing.
    """

    class GracefulServer(base):  # type: ignore[misc]
        async def shutdown(self, sockets: Any = None) -> None:
            for server in self.servers:
                server.close()  # no new connections from here on
            going_away = getattr(app.state, "going_away", None)
            if going_away is not None:
                try:
                    await going_away(GOING_AWAY_SECONDS)
                except Exception:
                    logging.getLogger("threadloom").exception("ending subscriptions for the shutdown failed")
            await super().shutdown(sockets)
            done = getattr(self.lifespan, "shutdown_event", None)
            if self.force_exit and done is not None and not done.is_set():
                await self._forced_app_shutdown()

        async def _forced_app_shutdown(self) -> None:
            """A second Ctrl-C makes uvicorn stop waiting for connections and skip the app's shutdown. Left
            undone, the app's cleanup was cancelled midway by the loop's teardown: an error-level traceback in
            the log, and the services stopped by nothing. It runs here instead, for a bounded time."""
            try:
                await asyncio.wait_for(self.lifespan.shutdown(), FORCED_SHUTDOWN_SECONDS)
            except TimeoutError:
                logging.getLogger("threadloom").warning(
                    "stopping at once: the services did not stop within %.0f s", FORCED_SHUTDOWN_SECONDS
                )

    return GracefulServer


def _existing_database(args: argparse.Namespace) -> Settings:
    """The settings of a command that needs the server's database, which must exist already.

    The data dir is `--data-dir`, else `THREADLOOM_DATA_DIR`, else the one the running (or last crashed)
    server announced (threadloom.server_state), else `./.threadloom`. A command never starts a new
    embedded database there: in the wrong folder that would be an empty one, with none of the server's data.
    """
    external = bool(os.environ.get("DATABASE_URL"))
    if args.data_dir:
        data_dir, source = Path(args.data_dir).absolute(), "--data-dir"
    elif os.environ.get("THREADLOOM_DATA_DIR"):
        data_dir, source = Path(os.environ["THREADLOOM_DATA_DIR"]).absolute(), "THREADLOOM_DATA_DIR"
    elif (announced := server_state.read()) is not None:
        if not announced.embedded and not external:
            raise CliError(
                "NO_DATABASE",
                f"the server at {announced.url} uses an external PostgreSQL: set DATABASE_URL to the same database",
            )
        data_dir, source = announced.data_dir, f"announced in {server_state.state_file()}"
    else:
        data_dir, source = Path(".threadloom").absolute(), "the default; no running server announced"
    if not external and not (data_dir / "pg" / "PG_VERSION").exists():
        raise CliError(
            "NO_DATABASE",
            f"no Threadloom database in {data_dir} ({source}): start the server (./scripts/serve) first, "
            "or point at its data dir with --data-dir or THREADLOOM_DATA_DIR (or DATABASE_URL)",
        )
    return Settings.from_env(data_dir=data_dir)


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = _existing_database(args)
    url, _server = _database_url(settings)
    _on_database(_migrate(url))
    from threadloom.store import migrate

    print(f"migrated to {migrate.head_revision()}")
    return 0


def cmd_export_schema(args: argparse.Namespace) -> int:
    from threadloom.api.schema import export_sdl

    sdl = export_sdl()
    if args.out is None or args.out == "-":  # stdout by default, as `strawberry export-schema` does
        sys.stdout.write(sdl)
    else:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(sdl)
        print(f"wrote {args.out}")
    return 0


async def _token(args: argparse.Namespace, url: str) -> int:
    import sqlalchemy as sa

    from threadloom.engine.clock import SystemClock
    from threadloom.store import migrate, tokens
    from threadloom.store.db import Database

    db = Database.from_url(url, pool_size=1)
    try:
        if not await migrate.is_migrated(db.engine):
            raise CliError("NOT_MIGRATED", "the database is not migrated: run `threadloom migrate` first")
        async with db.transaction() as tx:
            now = SystemClock().now()
            if args.token_command == "create":
                project = _uuid_of(args.project, "Project", "--project") if args.project else None
                if project is not None:
                    exists = await tx.scalar(sa.text("SELECT count(*) FROM projects WHERE id = :p"), {"p": project})
                    if not exists:
                        raise CliError("NOT_FOUND", f"no project {args.project}")
                expires_at = None if args.expires_in is None else now + args.expires_in
                info, secret = await tokens.create_token(
                    tx,
                    name=args.name,
                    scope=TokenScope(args.scope),
                    project_id=project,
                    now=now,
                    expires_at=expires_at,
                )
                expiry = "never" if expires_at is None else f"{expires_at:%Y-%m-%dT%H:%M:%SZ}"
                print(
                    f"created token {ids.encode(TOKEN_TYPE, info.id)} scope={info.scope}"
                    f" project={_project_gid(info.project_id)} expires={expiry}"
                )
                print(secret)
            elif args.token_command == "list":
                for t in await tokens.list_tokens(tx):
                    if t.revoked_at:
                        state = f"revoked {t.revoked_at:%Y-%m-%d}"
                    elif t.expires_at and t.expires_at <= now:
                        state = f"expired {t.expires_at:%Y-%m-%dT%H:%M:%SZ}"
                    elif t.expires_at:
                        state = f"active, expires {t.expires_at:%Y-%m-%dT%H:%M:%SZ}"
                    else:
                        state = "active"
                    gid = ids.encode(TOKEN_TYPE, t.id)
                    print(f"{gid}  {t.scope:<8} project={_project_gid(t.project_id)}  {state}  {t.name}")
            else:
                token_id = _uuid_of(args.id, TOKEN_TYPE, "the token id")
                if not await tokens.revoke_token(tx, token_id, now):
                    raise CliError("NOT_FOUND", f"no active token {args.id}")
                print(f"revoked {ids.encode(TOKEN_TYPE, token_id)}")
        return 0
    finally:
        await db.dispose()


def cmd_token(args: argparse.Namespace) -> int:
    settings = _existing_database(args)
    url, _server = _database_url(settings)
    return _on_database(_token(args, url))


def _on_database(work: Coroutine[Any, Any, T]) -> T:
    """Runs `work`; a database that cannot be reached is one coded line, not a driver's traceback."""
    import sqlalchemy as sa

    try:
        return asyncio.run(work)
    except (OSError, sa.exc.OperationalError, sa.exc.InterfaceError) as error:
        raise CliError("DATABASE_UNREACHABLE", f"cannot reach the database: {error}") from None


def _uuid_of(value: str, type_name: str, what: str) -> uuid.UUID:
    """The API's global id of `type_name` (as the CLI prints it), or the raw UUID inside one."""
    found = ids.decode(value)
    if found is not None and found[0] == type_name:
        return found[1]
    try:
        return uuid.UUID(value)
    except ValueError:
        kind = f"the id of a {found[0]}" if found is not None else "not an id"
        raise CliError("INVALID_ID", f"{what} {value!r} is {kind}; give a {type_name} id or a UUID") from None


def _project_id(value: str) -> str:
    """A project's UUID (as text) from its global id or the UUID itself."""
    return str(_uuid_of(value, "Project", "--project"))


def _project_gid(project_id: uuid.UUID | None) -> str:
    return "all" if project_id is None else ids.encode("Project", project_id)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(value: str) -> timedelta:
    """`--expires-in`: `90` (seconds), `45s`, `30m`, `1h`, `7d`; positive."""
    found = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", value.lower())
    if found is None or int(found[1]) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration (like 3600, 30m, 1h, 7d): {value}")
    return timedelta(seconds=int(found[1]) * _UNITS[found[2] or "s"])


def cmd_acp(args: argparse.Namespace) -> int:
    """Speaks the Agent Client Protocol on stdio for an editor, driving the server at --url (docs/acp.md)."""
    from threadloom.acp.bridge import Options, serve_stdio

    token = os.environ.get("THREADLOOM_TOKEN", "")
    if not token:
        raise CliError("TOKEN_MISSING", "threadloom acp: set THREADLOOM_TOKEN to a token of the server")
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)  # stdout carries the protocol only
    models = tuple(args.model or ())
    device = os.environ.get("THREADLOOM_DEVICE") or None  # the writer lease's device (docs/leases.md)
    options = Options(
        url=args.url, token=token, project_id=args.project, provider=args.provider, models=models, device=device
    )
    asyncio.run(serve_stdio(options))
    return 0


def cmd_providers(args: argparse.Namespace) -> int:
    """`providers probe INSTANCE`: start an `acp` instance's agent in a scratch folder, try each method it
    advertised, print what works and store the profile where the server's runtimes read it."""
    from threadloom.providers.acp.probe import probe_instance
    from threadloom.providers.registry import ConfigError, load_instances

    data_dir = getattr(args, "data_dir", None)
    if data_dir is None and not os.environ.get("THREADLOOM_DATA_DIR") and (announced := server_state.read()):
        data_dir = str(announced.data_dir)  # the running server's, whose runtimes read the stored profile
    settings = Settings.from_env(data_dir=data_dir)
    try:
        instances = load_instances(settings.providers_file)
    except ConfigError as error:
        raise CliError("BAD_PROVIDERS", str(error)) from None
    config = instances.get(args.instance)
    if config is None:
        raise CliError("UNKNOWN_PROVIDER_INSTANCE", f"no provider instance {args.instance!r} (THREADLOOM_PROVIDERS)")
    if config.driver != "acp":
        raise CliError("NOT_ACP", f"instance {args.instance!r} uses driver {config.driver!r}; only `acp` is probed")
    from threadloom.providers.contract import ProviderError

    try:
        report = asyncio.run(probe_instance(config, settings))
    except ProviderError as error:
        raise CliError("PROBE_FAILED", f"{error.code}: {error.message}") from None
    print("\n".join(report.lines()))
    return 0


DATA_DIR_HELP = (
    "data folder (env THREADLOOM_DATA_DIR; else, for commands other than serve, the one the running server "
    "announced in $XDG_STATE_HOME/threadloom/server.json; else ./.threadloom)"
)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="threadloom", description=__doc__)
    p.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    # Also after the command (`threadloom token list --data-dir X`); SUPPRESS keeps the one given before it.
    data_dir = _Parser(add_help=False)
    data_dir.add_argument("--data-dir", default=argparse.SUPPRESS, help=DATA_DIR_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve", parents=[data_dir], help="start the server (embedded PostgreSQL unless DATABASE_URL is set)"
    )
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.set_defaults(func=cmd_serve)
    mig = sub.add_parser("migrate", parents=[data_dir], help="upgrade the database schema to the newest revision")
    mig.set_defaults(func=cmd_migrate)
    exp = sub.add_parser("export-schema", help="print the GraphQL SDL (sorted), or write it to --out")
    exp.add_argument("--out", default=None, help="write to this file instead of stdout")
    exp.set_defaults(func=cmd_export_schema)
    acp = sub.add_parser("acp", help="be an Agent Client Protocol agent on stdio, for an editor (THREADLOOM_TOKEN)")
    default_url = os.environ.get("THREADLOOM_URL", "http://127.0.0.1:8000")
    acp.add_argument("--url", default=default_url, help="the server (env THREADLOOM_URL)")
    acp.add_argument("--project", default=None, help="the project of new sessions (default: the one holding cwd)")
    acp.add_argument("--provider", default=None, help="the provider instance of new sessions' threads")
    acp.add_argument(
        "--model", action="append", metavar="NAME", help="a model the editor's model option offers (repeatable)"
    )
    acp.set_defaults(func=cmd_acp)
    prov = sub.add_parser("providers", help="provider instances: probe an ACP agent's capabilities")
    psub = prov.add_subparsers(dest="providers_command", required=True)
    probe = psub.add_parser(
        "probe", parents=[data_dir], help="start an acp instance's agent, try each advertised method, store its profile"
    )
    probe.add_argument("instance", help="the provider instance (THREADLOOM_PROVIDERS)")
    prov.set_defaults(func=cmd_providers)
    tok = sub.add_parser("token", help="manage API tokens (ids are the API's global ids; raw UUIDs work too)")
    tsub = tok.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", parents=[data_dir], help="create a token; prints it as the last line")
    create.add_argument("--scope", choices=[s.value for s in TokenScope], required=True)
    create.add_argument("--project", default=None, help="bind to one project (its global id, or UUID)")
    create.add_argument("--name", default="cli")
    create.add_argument(
        "--expires-in", type=duration, default=None, help="stop working after this long (3600, 30m, 1h, 7d)"
    )
    tsub.add_parser("list", parents=[data_dir], help="list tokens (never their secrets)")
    revoke = tsub.add_parser("revoke", parents=[data_dir], help="revoke a token by id")
    revoke.add_argument("id")
    tok.set_defaults(func=cmd_token)
    return p


def main(argv: list[str] | None = None) -> int:
    """Every failure is one line `threadloom: CODE: message` on stderr and exit status 2 (1 when unexpected:
    `THREADLOOM_DEBUG=1` then shows the traceback)."""
    # pgserver's platformdirs warns on every start without XDG_RUNTIME_DIR (root over ssh, containers): noise.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        args = parser().parse_args(argv)
        return int(args.func(args))
    except CliError as error:
        _fail(error.code, str(error))
        return 2
    except OSError as error:
        _fail("IO_ERROR", str(error))
        return 2
    except Exception as error:
        if os.environ.get("THREADLOOM_DEBUG"):
            traceback.print_exc()
        _fail("INTERNAL", f"{type(error).__name__}: {error} (THREADLOOM_DEBUG=1 shows where)")
        return 1


def _fail(code: str, message: str) -> None:
    one_line = " ".join(message.split())
    print(f"threadloom: {code}: {one_line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

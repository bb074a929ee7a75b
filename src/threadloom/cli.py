"""The `threadloom` command: serve, migrate, export-schema, token create|list|revoke, acp."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import math
import os
import re
import signal
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from threadloom.config import Settings
from threadloom.domain.statuses import TokenScope
from threadloom.engine.clock import SystemClock
from threadloom.providers.registry import ConfigError, load_instances
from threadloom.store import migrate, tokens
from threadloom.store.db import Database


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
    db = Database.from_url(url, pool_size=1)
    try:
        await migrate.upgrade(db.engine)
    finally:
        await db.dispose()


async def _prepare(url: str, embedded: bool) -> str | None:
    """Migrate the embedded database (an external one must already be), then on an empty
    token table make the first admin token (under a lock: one process wins)."""
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
    import uvicorn

    from threadloom import logs
    from threadloom.app import create_app

    settings = Settings.from_env(host=args.host, port=args.port, data_dir=args.data_dir)
    logs.configure(settings.log_level)
    try:
        load_instances(settings.providers_file)
    except ConfigError as error:
        print(f"threadloom: {error}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, _exit_on_signal)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    url, server = _database_url(settings)
    admin = asyncio.run(_prepare(url, embedded=server is not None))
    print(f"Threadloom: http://{settings.host}:{settings.port}/graphql", flush=True)
    if server is not None:
        print(f"Embedded PostgreSQL in {settings.data_dir / 'pg'}", flush=True)
    if admin is not None:
        print(f"Admin token (shown once, keep it): {admin}", flush=True)
    app = create_app(settings, url)
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
        access_log=False,
        log_config=None,
    )
    _graceful_server(uvicorn.Server, app)(config).run()
    return int(getattr(app.state, "exit_code", 0))


GOING_AWAY_SECONDS = 1.0  # how long the subscriptions' last items may take to go out


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

    return GracefulServer


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = Settings.from_env(data_dir=args.data_dir)
    url, _server = _database_url(settings)
    asyncio.run(_migrate(url))
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
    db = Database.from_url(url, pool_size=1)
    try:
        if not await migrate.is_migrated(db.engine):
            print("the database is not migrated: run `threadloom migrate` first", file=sys.stderr)
            return 2
        async with db.transaction() as tx:
            now = SystemClock().now()
            if args.token_command == "create":
                project = uuid.UUID(args.project) if args.project else None
                if project is not None:
                    exists = await tx.scalar(sa.text("SELECT count(*) FROM projects WHERE id = :p"), {"p": project})
                    if not exists:
                        print(f"no project {project}", file=sys.stderr)
                        return 2
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
                print(f"created token {info.id} scope={info.scope} project={info.project_id or 'all'} expires={expiry}")
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
                    print(f"{t.id}  {t.scope:<8} project={t.project_id or 'all'}  {state}  {t.name}")
            else:
                if not await tokens.revoke_token(tx, uuid.UUID(args.id), now):
                    print(f"no active token {args.id}", file=sys.stderr)
                    return 2
                print(f"revoked {args.id}")
        return 0
    finally:
        await db.dispose()


def cmd_token(args: argparse.Namespace) -> int:
    settings = Settings.from_env(data_dir=args.data_dir)
    url, _server = _database_url(settings)
    return asyncio.run(_token(args, url))


def _project_id(value: str) -> str:
    """Accept a raw uuid or a GraphQL Project id."""
    from threadloom.api.ids import decode

    found = decode(value)
    if found is not None and found[0] == "Project":
        return str(found[1])
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a project id: {value}") from None


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
        print("threadloom acp: set THREADLOOM_TOKEN to a token of the server", file=sys.stderr)
        return 2
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)  # stdout carries the protocol only
    options = Options(url=args.url, token=token, project_id=args.project, provider=args.provider)
    asyncio.run(serve_stdio(options))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="threadloom", description=__doc__)
    p.add_argument("--data-dir", default=None, help="data folder (env THREADLOOM_DATA_DIR, default ./.threadloom)")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the server (embedded PostgreSQL unless DATABASE_URL is set)")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--data-dir", dest="data_dir", default=None)
    serve.set_defaults(func=cmd_serve)
    mig = sub.add_parser("migrate", help="upgrade the database schema to the newest revision")
    mig.set_defaults(func=cmd_migrate)
    exp = sub.add_parser("export-schema", help="print the GraphQL SDL (sorted), or write it to --out")
    exp.add_argument("--out", default=None, help="write to this file instead of stdout")
    exp.set_defaults(func=cmd_export_schema)
    acp = sub.add_parser("acp", help="be an Agent Client Protocol agent on stdio, for an editor (THREADLOOM_TOKEN)")
    default_url = os.environ.get("THREADLOOM_URL", "http://127.0.0.1:8000")
    acp.add_argument("--url", default=default_url, help="the server (env THREADLOOM_URL)")
    acp.add_argument("--project", default=None, help="the project of new sessions (default: the one holding cwd)")
    acp.add_argument("--provider", default=None, help="the provider instance of new sessions' threads")
    acp.set_defaults(func=cmd_acp)
    tok = sub.add_parser("token", help="manage API tokens")
    tsub = tok.add_subparsers(dest="token_command", required=True)
    create = tsub.add_parser("create", help="create a token; prints it as the last line")
    create.add_argument("--scope", choices=[s.value for s in TokenScope], required=True)
    create.add_argument("--project", type=_project_id, default=None, help="bind to one project")
    create.add_argument("--name", default="cli")
    create.add_argument(
        "--expires-in", type=duration, default=None, help="stop working after this long (3600, 30m, 1h, 7d)"
    )
    tsub.add_parser("list", help="list tokens (never their secrets)")
    revoke = tsub.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("id")
    tok.set_defaults(func=cmd_token)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except migrate.NotMigrated as error:
        print(f"threadloom: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

"""Command line: `python -m threadloom.agent --state-dir DIR [--workspace DIR] [--allow-network] [--hide DIR]...
[--own-workspaces DIR] [--chunk-delay-ms N] [--capabilities JSON]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from threadloom.agent.server import Options, Server
from threadloom.agent.wire import LineReader, LineWriter

DEFAULT_CAPABILITIES: dict[str, Any] = {
    "supportsActiveSteering": True,
    "supportsInterrupt": True,
    "supportsFork": True,
    "supportsRollback": True,
}


def capabilities(text: str) -> dict[str, Any]:
    """The effective flags: the defaults overridden (and extended) by the given JSON object."""
    try:
        flags = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(flags, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    for name in DEFAULT_CAPABILITIES:
        if name in flags and not isinstance(flags[name], bool):
            raise argparse.ArgumentTypeError(f"{name} must be true or false")
    return {**DEFAULT_CAPABILITIES, **flags}


def delay(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m threadloom.agent", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True, help="where conversations are kept")
    parser.add_argument("--chunk-delay-ms", type=delay, default=0, help="pause between streamed chunks")
    parser.add_argument(
        "--capabilities", type=capabilities, default=dict(DEFAULT_CAPABILITIES), help="JSON object of flags"
    )
    parser.add_argument(
        "--workspace", type=Path, default=None, help="the only folder threads may use (default: each thread's cwd)"
    )
    parser.add_argument(
        "--allow-network", action="store_true", help="let full_access threads' commands use the network"
    )
    parser.add_argument(
        "--hide", type=Path, action="append", default=[], help="a folder commands must not see (repeatable)"
    )
    parser.add_argument(
        "--own-workspaces",
        type=Path,
        default=None,
        help="a folder of forks' own workspaces: a thread whose cwd is in one of its subfolders uses that one only",
    )
    args = parser.parse_args(argv)
    return Options(
        state_dir=args.state_dir,
        chunk_delay_ms=args.chunk_delay_ms,
        capabilities=args.capabilities,
        workspace=args.workspace,
        allow_network=args.allow_network,
        hidden=tuple(args.hide),
        own_workspaces=args.own_workspaces,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="scripted-agent %(levelname)s: %(message)s")
    try:
        asyncio.run(_serve(options))
    except KeyboardInterrupt:
        return 130
    return 0


async def _serve(options: Options) -> None:
    reader = await LineReader.stdin()
    writer = await LineWriter.stdout()
    await Server(options, writer).serve(reader)
    await writer.flush(within=5.0)

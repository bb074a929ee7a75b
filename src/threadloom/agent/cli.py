"""Command line: `python -m threadloom.agent --state-dir DIR [--workspace DIR] [--allow-network] [--hide DIR]...
[--own-workspaces DIR] [--chunk-delay-ms N] [--capabilities JSON] [--acp [--acp-without F,...] [--acp-lie F,...]
[--acp-fault F,...] [--acp-huge-line-bytes N] [--acp-models M,...]]`."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from threadloom.agent.acp_options import FAULTS, FEATURES, HUGE_LINE_BYTES, MODELS, AcpOptions, names
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


def feature_list(text: str) -> frozenset[str]:
    try:
        return names(text, tuple(FEATURES))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def fault_list(text: str) -> frozenset[str]:
    try:
        return names(text, FAULTS)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def model_list(text: str) -> tuple[str, ...]:
    models = tuple(part.strip() for part in text.split(",") if part.strip())
    if not models:
        raise argparse.ArgumentTypeError("needs at least one model")
    return models


def parse_args(argv: Sequence[str] | None = None) -> tuple[Options, AcpOptions | None]:
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
    face = parser.add_argument_group('ACP face (docs/scripted-agent.md, "The ACP face")')
    face.add_argument("--acp", action="store_true", help="speak Agent Client Protocol v1 instead of Codex-shaped lines")
    face.add_argument(
        "--acp-without", type=feature_list, default=frozenset(), help=f"features not offered: {', '.join(FEATURES)}"
    )
    face.add_argument(
        "--acp-lie", type=feature_list, default=frozenset(), help="features advertised whose method answers -32601"
    )
    face.add_argument("--acp-fault", type=fault_list, default=frozenset(), help=f"traps: {', '.join(FAULTS)}")
    face.add_argument("--acp-huge-line-bytes", type=delay, default=HUGE_LINE_BYTES, help="size of the huge line")
    face.add_argument("--acp-models", type=model_list, default=MODELS, help="the model config option's values")
    args = parser.parse_args(argv)
    face_options = None
    if args.acp:
        face_options = AcpOptions(
            without=args.acp_without,
            lies=args.acp_lie,
            faults=args.acp_fault,
            huge_line_bytes=args.acp_huge_line_bytes,
            models=args.acp_models,
        )
    return Options(
        state_dir=args.state_dir,
        chunk_delay_ms=args.chunk_delay_ms,
        capabilities=args.capabilities,
        workspace=args.workspace,
        allow_network=args.allow_network,
        hidden=tuple(args.hide),
        own_workspaces=args.own_workspaces,
    ), face_options


def main(argv: Sequence[str] | None = None) -> int:
    options, face = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="scripted-agent %(levelname)s: %(message)s")
    try:
        if face is None:
            asyncio.run(_serve(options))
        else:
            from threadloom.agent import acp  # only the ACP face needs it: a Codex-shaped agent starts ~30 ms sooner

            asyncio.run(acp.serve(options, face))
    except KeyboardInterrupt:
        return 130
    return 0


async def _serve(options: Options) -> None:
    reader = await LineReader.stdin()
    writer = await LineWriter.stdout()
    await Server(options, writer).serve(reader)
    await writer.flush(within=5.0)

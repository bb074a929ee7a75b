"""The scripted agent: a deterministic coding agent in its own process, speaking Codex-shaped JSON lines.

It imports nothing from the rest of `threadloom` so that it stays a separate program, as Codex is; the
contract is docs/scripted-agent.md.
"""

VERSION = "0.1.0"

"""The `claude` driver: Claude Code (`claude -p`, stream-json over stdio) as a provider runtime.

A runtime serves one project (`ClaudeDriver.open_session(scope)`) and runs one `claude -p`
process per loaded native thread (a Claude session). The package, one concern a module:

- `driver.py`: the instance's options and the environment of its processes (HOME, config dir, TMPDIR);
- `runtime.py`: `ClaudeRuntime`, the threads of one project, their processes and turns, as one event stream;
- `process.py`: one claude child (its command line and the messages written to it), on `child_process`;
- `sessions.py`: session ids, transcripts and the driver's record per thread (resume, fork, fork from a turn);
- `permissions.py`: the sandbox settings and the answer to each permission prompt by runtime mode;
- `turns.py`: when an app turn ends (steering echoes, interrupts, results);
- `events.py`: the CLI's stream-json output → normalized provider events.

Each module's docstring records the Claude Code 2.1.197 behaviour it relies on.
"""

from threadloom.providers.claude.driver import ClaudeDriver
from threadloom.providers.claude.runtime import ClaudeRuntime

__all__ = ["ClaudeDriver", "ClaudeRuntime"]

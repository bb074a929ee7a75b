import sys

# The agent never speaks TLS, and asyncio imports ssl only when it can: without it a start costs ~8 ms less CPU
# (the suite starts hundreds of agents).
sys.modules["ssl"] = None  # type: ignore[assignment]

from threadloom.agent.cli import main  # noqa: E402

raise SystemExit(main())

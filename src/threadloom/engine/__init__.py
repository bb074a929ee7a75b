"""The orchestrator: command handlers, effect worker, ingest, recovery."""

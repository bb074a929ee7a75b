"""Persistence: tables, the event log, projections, receipts, the outbox, tokens."""

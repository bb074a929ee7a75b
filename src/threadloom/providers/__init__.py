"""Provider drivers behind one adapter contract. A driver knows its native protocol, not the DB."""

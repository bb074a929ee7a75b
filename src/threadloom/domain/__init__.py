"""Pure rules and entities: no I/O, no SQLAlchemy, no Strawberry."""

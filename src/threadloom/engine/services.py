"""The engine's services for one process, assembled once by `app.py`."""

from __future__ import annotations

import dataclasses

from threadloom.config import Settings
from threadloom.engine.catalog import Catalog
from threadloom.engine.clock import Clock
from threadloom.engine.pipeline import Pipeline
from threadloom.store.db import Database


@dataclasses.dataclass(slots=True)
class Services:
    settings: Settings
    db: Database
    clock: Clock
    pipeline: Pipeline
    catalog: Catalog

    @classmethod
    def build(cls, settings: Settings, db: Database, clock: Clock, provider_instances: list[str]) -> Services:
        pipeline = Pipeline(db, clock)
        catalog = Catalog(
            pipeline, provider_instances=provider_instances, default_instance=settings.default_provider_instance
        )
        return cls(settings, db, clock, pipeline, catalog)

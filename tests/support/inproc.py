"""Helpers for tests that drive the engine's services in-process (no HTTP)."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.support.graphql import workspace
from threadloom.domain.access import Principal
from threadloom.domain.dispatch import Dispatch
from threadloom.domain.statuses import TokenScope
from threadloom.engine.services import Services

ADMIN = Principal(uuid.uuid4(), TokenScope.ADMIN, None)


async def new_thread(services: Services, root: Path, instance: str | None = None) -> uuid.UUID:
    """A project at `root` (made if missing) and one thread in it (default runtime mode)."""
    project = await services.catalog.create_project(
        ADMIN, name="p", workspace_root=workspace(root.parent, root.name), key=None
    )
    return await services.catalog.create_thread(
        ADMIN,
        project_id=project,
        title="t",
        provider_instance_id=instance,
        model=None,
        runtime_mode="workspace_write",
        key=None,
    )


async def send(services: Services, thread: uuid.UUID, text: str) -> uuid.UUID:
    """sendMessage with the default dispatch; the new run's id."""
    sent = await services.dispatch.send_message(
        ADMIN, thread, text=text, dispatch=Dispatch(), provider_instance_id=None, model=None, client_message_id=None
    )
    return sent.run_id

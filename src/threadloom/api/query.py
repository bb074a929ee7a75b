"""Root query fields (their names are part of the public API)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Annotated, Any

import strawberry

from threadloom.api import enums
from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.errors import ApiError
from threadloom.api.pagination import Connection, paged
from threadloom.api.providers import ProviderInstance, provider_instances
from threadloom.api.tokens import ApiToken
from threadloom.api.tokens import tokens as list_api_tokens
from threadloom.api.types import NODE_TYPES, Node, Project, Run, Thread
from threadloom.api.usage import GroupByArgument, UsageGroup, project_usage
from threadloom.api.webhooks import WebhookDelivery, WebhookEndpoint, webhook_deliveries, webhook_endpoints
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.webhooks import DeliveryStatus


async def resolve_node(info: Info, global_id: str) -> Any:
    found = gid.decode(global_id)
    if found is None or found[0] not in NODE_TYPES:
        return None
    cls = NODE_TYPES[found[0]]
    row = await info.context.load_visible(cls.table(), found[1])
    return None if row is None else cls.from_row(row)


async def _typed(info: Info, cls: Any, global_id: str) -> Any:
    entity_id = gid.maybe_as(global_id, cls.__name__)
    return None if entity_id is None else await resolve_node(info, global_id)


@strawberry.type(description="Who is asking: the token's scope and, when bound, its project.")
class Viewer:
    scope: enums.TokenScope
    _project_id: strawberry.Private[uuid.UUID | None]

    @strawberry.field(description="The project this token is bound to; null for an all-projects token.")
    async def project(self, info: Info) -> Project | None:
        return await _typed(info, Project, gid.encode("Project", self._project_id)) if self._project_id else None


@strawberry.type
class Query:
    @strawberry.field(description="Any object by global id; null when unknown, invisible, or not an id.")
    async def node(self, info: Info, id: strawberry.ID) -> Node | None:
        return await resolve_node(info, id)  # type: ignore[no-any-return]

    @strawberry.field(description="Objects by global ids, in order; null for each unknown or invisible id.")
    async def nodes(self, info: Info, ids: list[strawberry.ID]) -> list[Node | None]:
        limit = info.context.services.settings.limits.max_page_size
        if len(ids) > limit:
            raise ApiError(DomainError(ErrorCode.PAGE_SIZE_EXCEEDED, f"at most {limit} ids at once", "ids"))
        return list(await asyncio.gather(*(resolve_node(info, i) for i in ids)))

    @strawberry.field(description="The configured provider instances and their capabilities, by id.")
    def provider_instances(self, info: Info) -> list[ProviderInstance]:
        return provider_instances(info)

    @strawberry.field
    def viewer(self, info: Info) -> Viewer:
        p = info.context.principal
        return Viewer(scope=p.scope, _project_id=p.project_id)

    @strawberry.field
    async def project(self, info: Info, id: strawberry.ID) -> Project | None:
        return await _typed(info, Project, id)  # type: ignore[no-any-return]

    @paged(
        "projects",
        "Project",
        parent=lambda _: None,
        description="The projects this token sees, oldest first; archived ones only with `includeArchived`.",
    )
    def projects(self, info: Info, include_archived: bool = False) -> dict[str, Any]:
        return {"only_project": info.context.principal.project_id, "include_archived": include_archived}

    @strawberry.field(
        description="API tokens, oldest first, for admins: a project's (`projectId`), or without it those for all "
        "projects (an admin token for all projects only). Null when the project is unknown or invisible; "
        "FORBIDDEN below admin scope. Revoked ones only with `includeRevoked`."
    )
    async def tokens(
        self, info: Info, project_id: strawberry.ID | None = None, include_revoked: bool = False
    ) -> list[ApiToken] | None:
        return await list_api_tokens(info, project_id, include_revoked)

    @strawberry.field(
        description="A project's webhook endpoints, oldest first, for its admins (docs/webhooks.md). Null when the "
        "project is unknown or invisible; FORBIDDEN below admin scope."
    )
    async def webhook_endpoints(self, info: Info, project_id: strawberry.ID) -> list[WebhookEndpoint] | None:
        return await webhook_endpoints(info, project_id)

    @strawberry.field(
        description="A webhook endpoint's deliveries, newest first, each with every attempt (status, answer code, "
        "latency, error), for its project's admins. `status` keeps those in that status; `first` (1..100, "
        "default 50) and `before` (a delivery's `cursor`) page back. Null when the endpoint is unknown or "
        "invisible; FORBIDDEN below admin scope."
    )
    async def webhook_deliveries(
        self,
        info: Info,
        endpoint_id: strawberry.ID,
        status: DeliveryStatus | None = None,
        first: int = 50,
        before: str | None = None,
    ) -> list[WebhookDelivery] | None:
        shown = None if status is None else enums.member(DeliveryStatus, status)
        return await webhook_deliveries(info, endpoint_id, shown, first, before)

    @strawberry.field
    async def thread(self, info: Info, id: strawberry.ID) -> Thread | None:
        return await _typed(info, Thread, id)  # type: ignore[no-any-return]

    @strawberry.field(description="Threads of a project, oldest first; null when the project is unknown or invisible.")
    async def threads(
        self,
        info: Info,
        project_id: strawberry.ID,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
        include_archived: bool = False,
    ) -> Connection[Thread] | None:
        project = await _typed(info, Project, project_id)
        if project is None:
            return None
        page = {"first": first, "after": after, "last": last, "before": before}
        return await project.threads(info, **page, include_archived=include_archived)  # type: ignore[no-any-return]

    @strawberry.field(
        description="A project's usage in [from, to) (either may be left out), broken down by `groupBy`, ordered by "
        "the groups (docs/usage.md). Null when the project is unknown or invisible; INVALID_INPUT when `to` is not "
        "after `from`."
    )
    async def usage(
        self,
        info: Info,
        project_id: Annotated[strawberry.ID, strawberry.argument(description="The project.")],
        from_: Annotated[
            datetime | None, strawberry.argument(name="from", description="The first instant counted (inclusive).")
        ] = None,
        to: Annotated[datetime | None, strawberry.argument(description="The end of the range (exclusive).")] = None,
        group_by: GroupByArgument = None,
    ) -> list[UsageGroup] | None:
        project = await _typed(info, Project, project_id)
        if project is None:
            return None
        if from_ is not None and to is not None and to <= from_:
            raise ApiError(DomainError(ErrorCode.INVALID_INPUT, "`to` must be after `from`", "to"))
        return await project_usage(info, project.rec.id, from_, to, group_by or [])

    @strawberry.field
    async def run(self, info: Info, id: strawberry.ID) -> Run | None:
        return await _typed(info, Run, id)  # type: ignore[no-any-return]

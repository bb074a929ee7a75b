"""Who may see and do what (docs/security.md).

A token has one scope and is bound to one project or, for admin tokens made without
`--project`, to all projects. Invisible things are reported as not found, so a token
cannot learn that another project's ids exist.
"""

from __future__ import annotations

import dataclasses
import uuid

from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.statuses import TokenScope

_RANK = {TokenScope.READ: 0, TokenScope.OPERATE: 1, TokenScope.ADMIN: 2}


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    token_id: uuid.UUID
    scope: TokenScope
    project_id: uuid.UUID | None  # None: every project
    # What the writer lease names (domain/leases.py): the token's name, and the device the request says it
    # comes from (`Threadloom-Device` header, `deviceId` in a socket's connection_init); None: no device.
    token_name: str = ""
    device_id: str | None = None

    def sees(self, project_id: uuid.UUID) -> bool:
        return self.project_id is None or self.project_id == project_id

    def has(self, scope: TokenScope) -> bool:
        return _RANK[self.scope] >= _RANK[scope]

    def require(self, scope: TokenScope) -> None:
        if not self.has(scope):
            raise DomainError(ErrorCode.FORBIDDEN, f"this token's scope is {self.scope}; {scope} is needed")

    def require_project(self, project_id: uuid.UUID, scope: TokenScope, field: str) -> None:
        """Refuse with NOT_FOUND when invisible, FORBIDDEN when visible but under-scoped."""
        if not self.sees(project_id):
            raise not_found(field)
        self.require(scope)

    def require_global_admin(self) -> None:
        if self.scope != TokenScope.ADMIN or self.project_id is not None:
            raise DomainError(ErrorCode.FORBIDDEN, "creating projects needs an admin token for all projects")


# The server acting on its own (a budget's stop, a delegated task stopped with its parent): not a client, so
# the guards on clients' commands (a rollback under way, another device's writer lease) do not apply to it.
SERVER = Principal(uuid.UUID(int=1), TokenScope.ADMIN, None, token_name="server")


def is_server(principal: Principal) -> bool:
    return principal.token_id == SERVER.token_id

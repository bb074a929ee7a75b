"""`providerInstances`: what a client may pick for `createThread`, and what each can do.

Front ends use the capabilities to show or hide controls (steer, interrupt, fork, rollback)
before asking; the engine plans with the same values.
"""

from __future__ import annotations

import inspect

import strawberry

from threadloom.api.context import Info
from threadloom.providers.contract import Capabilities


@strawberry.type(description="What a provider instance's driver can do natively.")
class ProviderCapabilities:
    supports_active_steering: bool
    supports_interrupt: bool
    supports_steering_by_interrupt_restart: bool
    can_fork_thread: bool
    can_fork_from_turn: bool
    can_rollback_thread: bool
    can_read_thread_snapshot: bool
    supports_structured_questions: bool
    emits_todo_list: bool
    supports_subagents: bool
    pending_requests_survive_restart: bool
    reports_cost: bool = strawberry.field(
        description="The agent reports what its model calls cost; else only the instance's price table can tell "
        "(a USD budget needs one or the other)."
    )

    @classmethod
    def of(cls, caps: Capabilities) -> ProviderCapabilities:
        """The driver's capabilities as declared above (the engine's own, such as empty thread creation, stay out)."""
        return cls(**{name: getattr(caps, name) for name in inspect.get_annotations(cls)})


@strawberry.type(description="A configured provider instance (docs/providers.md).")
class ProviderInstance:
    id: str
    driver: str = strawberry.field(description="scripted, codex or claude.")
    is_default: bool = strawberry.field(description="Used by createThread when no providerInstanceId is given.")
    capabilities: ProviderCapabilities


def provider_instances(info: Info) -> list[ProviderInstance]:
    services = info.context.services
    default = services.catalog.default_instance
    return [
        ProviderInstance(
            id=name,
            driver=config.driver,
            is_default=name == default,
            capabilities=ProviderCapabilities.of(services.sessions.drivers[name].capabilities()),
        )
        for name, config in sorted(services.instances.items())
    ]

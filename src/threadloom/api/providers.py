"""`providerInstances`: what a client may pick for `createThread`, and what each can do.

Front ends use the capabilities to show or hide controls (steer, interrupt, fork, rollback)
before asking; the engine plans with the same values.
"""

from __future__ import annotations

import enum
import inspect

import strawberry

from threadloom.api.context import Info
from threadloom.providers.acp import profile as acp
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


@strawberry.enum(
    description="How an ACP agent's method fared: WORKS (advertised and answered, or probed working), "
    "UNSUPPORTED (advertised, but it answered -32601 'method not found'), FAILED (advertised, but the probe's "
    "harmless call failed otherwise), NOT_PROBED (advertised; no probe has tried it yet: the engine takes the "
    "agent's word), NOT_ADVERTISED (the agent does not offer it: the engine uses the fallback)."
)
class AcpMethodStatus(enum.StrEnum):
    WORKS = "works"
    UNSUPPORTED = "unsupported"
    FAILED = "failed"
    NOT_PROBED = "not_probed"
    NOT_ADVERTISED = "not_advertised"


@strawberry.type(description="One ACP method (or extension) of an agent's capability profile.")
class AcpMethodSupport:
    method: str = strawberry.field(description="The JSON-RPC method, e.g. session/fork or _session/steering.")
    advertised: bool = strawberry.field(description="The agent's `initialize` answer offers it.")
    status: AcpMethodStatus = strawberry.field(description="What is known of it working (see AcpMethodStatus).")
    note: str | None = strawberry.field(description="What the probe saw, when it saw something worth saying.")


@strawberry.type(
    description="What an ACP agent (driver `acp`) can really do, per agent and version: what its `initialize` "
    "advertised, checked by `threadloom providers probe INSTANCE`. Dispatch, interruption, fork and rollback "
    "plan with it (docs/providers.md, ACP: the fallback table)."
)
class AcpProfile:
    agent_name: str = strawberry.field(description="The agent's name from `initialize` (`agentInfo.name`).")
    agent_version: str = strawberry.field(description="The agent's version from `initialize` (`agentInfo.version`).")
    protocol_version: int = strawberry.field(description="The ACP protocol version the agent speaks (1).")
    probed_at: str | None = strawberry.field(
        description="When `threadloom providers probe` last checked this agent version (ISO 8601, UTC); null: "
        "never, the profile is the agent's own word."
    )
    methods: list[AcpMethodSupport] = strawberry.field(description="Each tracked method, in the probe's order.")

    @classmethod
    def of(cls, profile: acp.AcpProfile) -> AcpProfile:
        methods = [
            AcpMethodSupport(
                method=name,
                advertised=profile.advertised.get(name, False),
                status=AcpMethodStatus(profile.status(name)),
                note=profile.notes.get(name),
            )
            for name in acp.METHODS
        ]
        return cls(
            agent_name=profile.agent_name,
            agent_version=profile.agent_version,
            protocol_version=profile.protocol_version,
            probed_at=profile.probed_at,
            methods=methods,
        )


@strawberry.type(description="A configured provider instance (docs/providers.md).")
class ProviderInstance:
    id: str
    driver: str = strawberry.field(description="scripted, codex, claude or acp.")
    is_default: bool = strawberry.field(description="Used by createThread when no providerInstanceId is given.")
    capabilities: ProviderCapabilities
    acp_profile: AcpProfile | None = strawberry.field(
        description="For an `acp` instance: the capability profile of its agent (the one seen last, probed or "
        "not); null for other drivers and for an acp instance whose agent has not started yet."
    )


def _acp_profile(driver: object) -> AcpProfile | None:
    from threadloom.providers.acp.driver import AcpDriver

    if not isinstance(driver, AcpDriver):
        return None
    profile = driver.profile()  # re-read: a probe run since by the CLI shows at once
    return None if profile is acp.UNKNOWN else AcpProfile.of(profile)


def provider_instances(info: Info) -> list[ProviderInstance]:
    services = info.context.services
    default = services.catalog.default_instance
    out = []
    for name, config in sorted(services.instances.items()):
        driver = services.sessions.drivers[name]
        profile = _acp_profile(driver)  # first: it refreshes the capabilities below
        out.append(
            ProviderInstance(
                id=name,
                driver=config.driver,
                is_default=name == default,
                capabilities=ProviderCapabilities.of(driver.capabilities()),
                acp_profile=profile,
            )
        )
    return out

"""The writer lease's rules (domain/leases.py), pure: who holds a thread, when it runs out, what another holder is
refused, what a takeover and a release record, and that the server's own steps and a Stop are never refused."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from tests.support.builders import NOW, Ids, thread
from threadloom.domain import leases
from threadloom.domain.access import Principal
from threadloom.domain.entities import Activity, AppThread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.rollback_ops import ALLOWED_WHILE_ROLLING_BACK
from threadloom.domain.statuses import TokenScope

LAPTOP_TOKEN, PHONE_TOKEN = uuid.UUID(int=11), uuid.UUID(int=12)
LAPTOP = Principal(LAPTOP_TOKEN, TokenScope.OPERATE, None, token_name="laptop-token", device_id="laptop")
PHONE = Principal(PHONE_TOKEN, TokenScope.OPERATE, None, token_name="phone-token", device_id="phone")


def _held_by_laptop(ttl: int = 60) -> AppThread:
    changes = leases.acquire(thread(), LAPTOP, ttl, False, NOW, Ids())
    held = changes[0].entity
    assert isinstance(held, AppThread)
    return held


def _code(call: object) -> ErrorCode:
    assert callable(call)
    with pytest.raises(DomainError) as refused:
        call()
    return refused.value.code


def test_a_lease_is_live_until_its_expiry_and_not_at_it() -> None:
    held = _held_by_laptop(ttl=30)
    assert leases.holder(held, NOW + timedelta(seconds=29)) is not None
    assert leases.holder(held, NOW + timedelta(seconds=30)) is None
    assert leases.holder(thread(), NOW) is None


@pytest.mark.parametrize(
    "other",
    [
        PHONE,
        Principal(LAPTOP_TOKEN, TokenScope.OPERATE, None, token_name="laptop-token", device_id=None),
        Principal(LAPTOP_TOKEN, TokenScope.OPERATE, None, token_name="laptop-token", device_id="laptop-2"),
        Principal(PHONE_TOKEN, TokenScope.ADMIN, None, token_name="phone-token", device_id="laptop"),
    ],
    ids=["another token", "same token no device", "same token other device", "another token same device name"],
)
def test_any_other_holder_is_refused_a_write_naming_the_holder(other: Principal) -> None:
    held = _held_by_laptop()
    with pytest.raises(DomainError) as refused:
        leases.refuse_other_writer(held, other, "sendMessage", NOW)
    assert refused.value.code == ErrorCode.WRITER_LEASE_HELD
    assert "device 'laptop' (token 'laptop-token')" in refused.value.message
    leases.refuse_other_writer(held, LAPTOP, "sendMessage", NOW)  # the holder itself
    leases.refuse_other_writer(held, other, "sendMessage", NOW + timedelta(seconds=60))  # once it ran out
    leases.refuse_other_writer(thread(), other, "sendMessage", NOW)  # no lease: as before


def test_stop_and_the_lease_commands_are_never_refused_by_the_lease() -> None:
    held = _held_by_laptop()
    for command in ("stopThread", "acquireThreadLease", "renewThreadLease", "releaseThreadLease"):
        leases.refuse_other_writer(held, PHONE, command, NOW)
    # Stop is also the one run-changing command a rollback lets through: both rules keep the safety valve.
    assert "stopThread" in ALLOWED_WHILE_ROLLING_BACK & leases.ALLOWED_FROM_ANYONE


def test_a_takeover_moves_the_lease_and_records_who_had_it() -> None:
    held = _held_by_laptop()
    assert _code(lambda: leases.acquire(held, PHONE, 60, False, NOW, Ids())) == ErrorCode.WRITER_LEASE_HELD
    changes = leases.acquire(held, PHONE, 60, True, NOW, Ids())
    assert [c.event_type for c in changes] == ["thread.leased", "activity.recorded"]
    moved, told = changes[0].entity, changes[1].entity
    assert isinstance(moved, AppThread) and isinstance(told, Activity)
    assert (moved.lease_device_id, moved.lease_token_id) == ("phone", PHONE_TOKEN)
    assert told.kind == "lease.taken_over"
    assert told.payload == {
        "holder": {"deviceId": "phone", "tokenName": "phone-token"},
        "previous": {"deviceId": "laptop", "tokenName": "laptop-token"},
    }
    assert moved.updated_at == held.updated_at  # the lease is not a change of the conversation


def test_acquiring_ones_own_lease_again_extends_it_without_an_activity() -> None:
    held = _held_by_laptop(ttl=10)
    changes = leases.acquire(held, LAPTOP, 100, False, NOW + timedelta(seconds=5), Ids())
    assert [c.event_type for c in changes] == ["thread.leased"]
    assert leases.holder(changes[0].entity, NOW + timedelta(seconds=104)) is not None  # type: ignore[arg-type]


def test_renew_extends_only_a_live_lease_of_ones_own() -> None:
    held = _held_by_laptop(ttl=10)
    renewed = leases.renew(held, LAPTOP, 100, NOW + timedelta(seconds=5))[0].entity
    assert isinstance(renewed, AppThread) and renewed.lease_expires_at == NOW + timedelta(seconds=105)
    assert _code(lambda: leases.renew(held, PHONE, 60, NOW)) == ErrorCode.LEASE_NOT_HELD
    assert _code(lambda: leases.renew(held, LAPTOP, 60, NOW + timedelta(seconds=10))) == ErrorCode.LEASE_NOT_HELD


def test_release_clears_the_lease_and_only_its_holder_may_release() -> None:
    held = _held_by_laptop()
    assert _code(lambda: leases.release(held, PHONE, NOW, Ids())) == ErrorCode.WRITER_LEASE_HELD
    changes = leases.release(held, LAPTOP, NOW, Ids())
    cleared, told = changes[0].entity, changes[1].entity
    assert isinstance(cleared, AppThread) and leases.holder(cleared, NOW) is None
    assert isinstance(told, Activity) and told.kind == "lease.released"
    assert leases.release(cleared, PHONE, NOW, Ids()) == []  # no one holds it: nothing to do


@pytest.mark.parametrize("ttl", [0, -1, 3601])
def test_a_ttl_out_of_bounds_is_invalid_input(ttl: int) -> None:
    assert _code(lambda: leases.acquire(thread(), LAPTOP, ttl, False, NOW, Ids())) == ErrorCode.INVALID_INPUT


@pytest.mark.parametrize("raw", ["", "   ", "x" * 129, "tab\there"])
def test_a_device_id_must_be_a_short_printable_name(raw: str) -> None:
    assert _code(lambda: leases.clean_device_id(raw)) == ErrorCode.INVALID_INPUT
    assert leases.clean_device_id("  phone  ") == "phone"
    nameless = Principal(PHONE_TOKEN, TokenScope.OPERATE, None)
    assert _code(lambda: leases.acquire(thread(), nameless, 60, False, NOW, Ids())) == ErrorCode.INVALID_INPUT

"""A tiny base for entities that travel as event payloads.

An event carries the whole updated entity; applying it is an upsert by id. `Record`
gives every entity the two conversions that needs: to a JSON-able dict and back, with
UUIDs, datetimes and enums restored from their string forms.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import uuid
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar, Self

Converter = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _to_uuid(value: Any) -> uuid.UUID:
    # asyncpg hands back its own UUID subclass, which orjson does not encode.
    return value if type(value) is uuid.UUID else uuid.UUID(str(value))


def _to_datetime(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _converter_for(hint: Any) -> Converter:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        convert = _converter_for(inner[0]) if len(inner) == 1 else _identity
        return lambda v: None if v is None else convert(v)
    if hint is uuid.UUID:
        return _to_uuid
    if hint is datetime:
        return _to_datetime
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint
    if origin is tuple:
        return lambda v: tuple(v)
    return _identity


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """Base of all entities. Subclasses set `entity_type` (the event/table name)."""

    entity_type: ClassVar[str] = ""

    id: uuid.UUID

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def _field_converters(cls) -> dict[str, Converter]:
        found = cls.__dict__.get("_converters_cache")
        if found is None:
            hints = typing.get_type_hints(cls)
            found = {f.name: _converter_for(hints[f.name]) for f in dataclasses.fields(cls)}
            type.__setattr__(cls, "_converters_cache", found)
        return typing.cast(dict[str, Converter], found)

    @classmethod
    def from_mapping(cls, data: typing.Mapping[Any, Any]) -> Self:
        """Build from a payload dict or a database row mapping (extra keys ignored)."""
        conv = cls._field_converters()
        return cls(**{name: fn(data[name]) for name, fn in conv.items() if name in data})

    def to_payload(self) -> dict[str, Any]:
        """Plain dict of the fields; orjson encodes UUID, datetime and enums natively."""
        return {name: getattr(self, name) for name in self.field_names()}

    def evolve(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)

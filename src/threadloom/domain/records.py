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


_new = object.__new__
_set = object.__setattr__
_UNKNOWN = uuid.SafeUUID.unknown


def _to_uuid(value: Any) -> uuid.UUID:
    if type(value) is uuid.UUID:
        return value
    if isinstance(value, uuid.UUID):
        # asyncpg's own subclass (orjson does not encode it): the same 128 bits, copied as
        # uuid.UUID.__init__ stores them, without parsing its text (a page of rows holds many).
        found = _new(uuid.UUID)
        _set(found, "int", value.int)
        _set(found, "is_safe", _UNKNOWN)
        return found
    return uuid.UUID(str(value))


def _to_datetime(value: Any) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value)


def _converter_for(hint: Any) -> tuple[Converter | None, bool]:
    """How a stored value of type `hint` is restored (None: kept as is), and whether null passes as null."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        convert = _converter_for(inner[0])[0] if len(inner) == 1 else None
        return convert, True
    if hint is uuid.UUID:
        return _to_uuid, False
    if hint is datetime:
        return _to_datetime, False
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint, False
    if origin is tuple:
        return _tuple, False
    return None, False


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """Base of all entities. Subclasses set `entity_type` (the event/table name)."""

    entity_type: ClassVar[str] = ""

    id: uuid.UUID

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def _field_converters(cls) -> tuple[tuple[str, ...], tuple[tuple[str, Converter, bool], ...]]:
        """Every field's name, and (name, converter, nullable) for the fields whose values are converted."""
        found = cls.__dict__.get("_converters_cache")
        if found is None:
            hints = typing.get_type_hints(cls)
            names = tuple(f.name for f in dataclasses.fields(cls))
            converted = []
            for name in names:
                convert, nullable = _converter_for(hints[name])
                if convert is not None:
                    converted.append((name, convert, nullable))
            found = (names, tuple(converted))
            type.__setattr__(cls, "_converters_cache", found)
        return typing.cast(tuple[tuple[str, ...], tuple[tuple[str, Converter, bool], ...]], found)

    @classmethod
    def from_mapping(cls, data: typing.Mapping[Any, Any]) -> Self:
        """Build from a payload dict or a database row mapping (extra keys ignored).

        A page of rows builds many records: the values are taken as they are and only the
        fields that need it (UUIDs, datetimes, enums, tuples) are converted. A dict holding
        every field (a row read as a dict) is built by a function made once per class
        (`_dict_builder`) that does the same without a loop.
        """
        if type(data) is dict:
            build = _DICT_BUILDERS.get(cls)
            if build is None:
                build = _DICT_BUILDERS[cls] = _dict_builder(cls)
            built = build(data)
            if built is not None:
                return typing.cast(Self, built)
        names, converted = cls._field_converters()
        values = {name: data[name] for name in names if name in data}
        for name, convert, nullable in converted:
            if name in values:
                value = values[name]
                if value is not None or not nullable:
                    values[name] = convert(value)
        return cls(**values)

    def to_payload(self) -> dict[str, Any]:
        """Plain dict of the fields; orjson encodes UUID, datetime and enums natively."""
        return {name: getattr(self, name) for name in self.field_names()}

    def evolve(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)


# By record class: its `_dict_builder` function.
_DICT_BUILDERS: dict[type[Record], Callable[[dict[Any, Any]], Any]] = {}


def _dict_builder(cls: type[Record]) -> Callable[[dict[Any, Any]], Any]:
    """A function building `cls` from a dict that holds every field (None when one is missing),
    converting the same fields as `from_mapping`'s loop, without a loop."""
    names, converted = cls._field_converters()
    namespace: dict[str, Any] = {"cls": cls, "names": frozenset(names), "UUID": uuid.UUID, "to_uuid": _to_uuid}
    args = {name: f"data[{name!r}]" for name in names}
    reads = []
    for i, (name, convert, nullable) in enumerate(converted):
        namespace[f"c{i}"] = convert
        value = f"v{i}"
        reads.append(f"    {value} = data[{name!r}]\n")
        if convert is _to_uuid:
            call = f"({value} if {value}.__class__ is UUID else to_uuid({value}))"
        else:
            call = f"c{i}({value})"
        args[name] = f"(None if {value} is None else {call})" if nullable else call
    body = ", ".join(f"{name}={expression}" for name, expression in args.items())
    head = "def build(data):\n    if not data.keys() >= names:\n        return None\n"
    source = f"{head}{''.join(reads)}    return cls({body})\n"
    exec(compile(source, f"<{cls.__name__}.from_mapping>", "exec"), namespace)  # the record's own field names
    return typing.cast(Callable[[dict[Any, Any]], Any], namespace["build"])

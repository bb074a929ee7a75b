"""`record`: a frozen, slotted value class whose methods are shared functions, not code compiled per class.

`dataclasses` compiles each class's `__init__`, `__repr__`, `__eq__`, `__hash__` and frozen `__setattr__` with
`exec`, about 0.7 ms a class. The directive language alone has twenty classes, so every agent start spent
~15 ms there, and the test suite starts hundreds of agents. A record reads its fields from `__slots__` instead.
Type checkers see a frozen dataclass (`dataclass_transform`): the same constructor signatures, defaults and
immutability. Fields are the class's own annotations, in order; a default is a plain class attribute.
"""

from __future__ import annotations

import inspect
from typing import Any, TypeVar, dataclass_transform

C = TypeVar("C", bound=type)
_MISSING = object()


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    cls = type(self)
    names: tuple[str, ...] = cls.__slots__
    if len(args) > len(names):
        raise TypeError(f"{cls.__name__}() takes {len(names)} arguments but {len(args)} were given")
    values = dict(zip(names, args, strict=False))
    for name, value in kwargs.items():
        if name not in names:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {name!r}")
        if name in values:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
        values[name] = value
    defaults: dict[str, Any] = cls._record_defaults
    for name in names:
        value = values.get(name, defaults.get(name, _MISSING))
        if value is _MISSING:
            raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
        object.__setattr__(self, name, value)


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, name) for name in type(self).__slots__)


def _eq(self: Any, other: object) -> object:  # a bool, or NotImplemented for another type
    if type(other) is not type(self):
        return NotImplemented
    return bool(_values(self) == _values(other))


def _hash(self: Any) -> int:
    return hash((type(self), _values(self)))


def _repr(self: Any) -> str:
    fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__slots__)
    return f"{type(self).__qualname__}({fields})"


def _frozen(self: Any, name: str, value: Any = None) -> None:
    raise AttributeError(f"cannot assign to field {name!r} of a {type(self).__name__} record")


@dataclass_transform(frozen_default=True)
def record(cls: C) -> C:
    """`cls` made again as a frozen, slotted record of its own annotated fields."""
    names = tuple(inspect.get_annotations(cls))  # its own, not its bases'
    namespace = {k: v for k, v in cls.__dict__.items() if k not in names and k not in ("__dict__", "__weakref__")}
    namespace.update(
        __slots__=names,
        __match_args__=names,
        _record_defaults={name: cls.__dict__[name] for name in names if name in cls.__dict__},
        __init__=_init,
        __eq__=_eq,
        __hash__=_hash,
        __repr__=_repr,
        __setattr__=_frozen,
        __delattr__=_frozen,
    )
    made: C = type(cls)(cls.__name__, cls.__bases__, namespace)
    return made

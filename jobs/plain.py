"""A dataclass's fields to and from plain JSON values, by their annotated types: the one place that knows
how a typed field is written, so a record's JSON (``JobSpec.to_json``) and its SQL row (``jobs.store.rows``)
follow its fields instead of naming each one again.

The types a stored field may have: str, int, float, bool, an Enum, ``X | None``, ``tuple[X, ...]``, a fixed
``tuple[X, Y]``, ``Mapping[str, str]``, a list (a kept option's) and ``Any`` (kept as it is); any other is a
TypeError when the module declaring the field is loaded, not a value written wrong. Reading checks every
value against its type, since what is read may come from a user's request file: a wrong one raises
``BadInput`` naming it.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput


def hints(cls: type) -> dict[str, Any]:
    """The resolved type of each field of the dataclass ``cls`` (its annotations are strings)."""
    resolved = typing.get_type_hints(cls)
    return {field.name: resolved[field.name] for field in dataclasses.fields(cls)}


def default(field: dataclasses.Field[Any]) -> Any:
    """What a field holds when it is not given (``dataclasses.MISSING``: it must be)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def optional_of(hint: Any) -> Any:
    """X of ``X | None``, or None when ``hint`` is not optional."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(rest) == 1 and len(typing.get_args(hint)) == 2:
            return rest[0]
    return None


Reader = Callable[[Any], Any]
Writer = Callable[[Any], Any]


def writer(hint: Any) -> Writer:
    """How a value of type ``hint`` is written as JSON holds it: tuples as lists, enums as their values,
    mappings as dicts. Made once per field, not per value: the daemon writes and reads thousands of specs."""
    inner = optional_of(hint)
    if inner is not None:
        write = writer(inner)
        return lambda value: None if value is None else write(value)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = writer(args[0])
            return lambda value: [item(each) for each in value]
        items = [writer(arg) for arg in args]
        return lambda value: [write(each) for write, each in zip(items, value, strict=True)]
    if origin is Mapping or origin is dict:
        return dict
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return lambda value: value.value
    if hint in _SCALARS or hint is Any:
        return lambda value: value
    raise TypeError(f"jobs.plain cannot store a field of type {hint!r}: give it one of the types listed at its top")


def reader(hint: Any, name: str) -> Reader:
    """How a JSON value is read back as ``hint``, checked (request files come from users and may hold
    anything): a wrong one raises ``BadInput`` naming ``name``. Made once per field, like ``writer``."""
    inner = optional_of(hint)
    if inner in _SCALARS:
        return lambda value: value if value is None or type(value) is inner else scalar(value, inner, name)
    if inner is not None:
        read = reader(inner, name)
        return lambda value: None if value is None else read(value)
    if hint in _SCALARS:  # what nearly every value is: checked without a call
        return lambda value: value if type(value) is hint else scalar(value, hint, name)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if args[0] is str:
            return lambda value: _strings(value, name)
        item = reader(args[0], name)
        return lambda value: tuple(item(each) for each in scalar(value, list, name))
    if origin is tuple:
        items = [reader(arg, name) for arg in args]
        second = "values" if len(args) == 2 and typing.get_origin(args[1]) is tuple else "value"

        def fixed(value: Any) -> tuple[Any, ...]:
            if not isinstance(value, list) or len(value) != len(items):
                raise BadInput(f"{name} must be a list of [name, {second}] pairs")
            return tuple(read(each) for read, each in zip(items, value, strict=True))

        return fixed
    if origin is Mapping or origin is dict:
        return lambda value: _texts(value or {}, name)  # a request written without one (null) has none
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        members = {member.value: member for member in hint}  # hint(value) costs a microsecond a value
        return lambda value: members[value] if type(value) is str and value in members else hint(value)
    if hint is Any:
        return lambda value: value
    raise TypeError(f"jobs.plain cannot store {name} of type {hint!r}: give it one of the types listed at its top")


_SCALARS = (str, int, float, bool, list)


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise BadInput(f"{name} must be a list of strings")
    return tuple(value)


def _texts(value: Any, name: str) -> Any:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadInput(f"{name} must map strings to strings")
    return value


def scalar(value: Any, kind: type, name: str) -> Any:
    """``value`` if it is of ``kind`` (an int where a float goes reads as that float; a bool is no number)."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise BadInput(f"{name} must be true or false, not {type(value).__name__}")
        return value
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadInput(f"{name} must be {kind.__name__}, not {type(value).__name__}")
    return value

"""How a journal event is laid out on disk: each event class's writer and reader, made once from its fields
(``jobs.plain``), so ``jobs.store.events`` declares the events and nothing there names a key by hand.

The layout (``jobs.store.events`` says why it is this one): ``"t"``, then ``"job"`` (or ``"array"``), then
``"event"`` (the ``kind`` field), then the rest; a field whose default is None is left out while it is None
unless its metadata marks it ``null``; a field marked ``key`` is written under that name; a field marked
``flat`` spreads its keys beside the others and gathers, on reading, every key the class does not declare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gpuq_scheduler.jobs import plain
from gpuq_scheduler.jobs.errors import BadInput

E = TypeVar("E")


@dataclass(frozen=True)
class _Field:
    name: str
    key: str  # its name on disk
    write: plain.Writer
    read: plain.Reader
    required: bool
    default: dataclasses.Field[Any]
    left_out_when_none: bool


class Codec(Generic[E]):
    """How one event class is written and read, made once from its fields (``jobs.plain``)."""

    def __init__(self, cls: type[E]) -> None:
        hints = plain.hints(cls)
        self.cls = cls
        self.fields: list[_Field] = []
        self.flat: str | None = None
        for found in dataclasses.fields(cls):  # type: ignore[arg-type]  # an event class is a dataclass
            if found.metadata.get("flat"):
                self.flat = found.name
                continue
            key = "event" if found.name == "kind" else found.metadata.get("key", found.name)
            required = found.default is dataclasses.MISSING and found.default_factory is dataclasses.MISSING
            self.fields.append(
                _Field(
                    found.name,
                    key,
                    plain.writer(hints[found.name]),
                    plain.reader(hints[found.name], key),
                    required,
                    found,
                    found.default is None and not found.metadata.get("null"),
                )
            )
        # On disk: "t", then "job" (or "array"), then "event", then the rest, as gpuq wrote them before #41.
        first = {"t": 0, "job": 1, "array": 1, "event": 2}
        self.fields.sort(key=lambda f: first.get(f.key, 3))
        self.keys = frozenset(f.key for f in self.fields)

    def write(self, event: E) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for each in self.fields:
            value = getattr(event, each.name)
            if value is None and each.left_out_when_none:
                continue
            out[each.key] = each.write(value)
        if self.flat is not None:
            for key, value in getattr(event, self.flat).items():
                out.setdefault(key, value)
        return out

    def read(self, data: Mapping[str, Any]) -> E:
        given: dict[str, Any] = {}
        for each in self.fields:
            if each.key in data:
                try:
                    given[each.name] = each.read(data[each.key])
                except (ValueError, KeyError):  # an enum's value it does not have
                    said = str(data[each.key])[:40]
                    raise BadInput(f"a {data.get('event')} event whose {each.key} is {said!r}") from None
            elif each.required:
                raise BadInput(f"a {data.get('event')} event without its {each.key}")
        if self.flat is not None:
            given[self.flat] = {key: value for key, value in data.items() if key not in self.keys}
        try:
            return self.cls(**given)
        except ValueError as err:
            raise BadInput(str(err)) from None


_CODECS: dict[type[Any], Codec[Any]] = {}


def codec(cls: type[E]) -> Codec[E]:
    """Made once per class, not per event: the daemon writes thousands of events in a pass."""
    found = _CODECS.get(cls)
    if found is None:
        found = _CODECS[cls] = Codec(cls)
    return found

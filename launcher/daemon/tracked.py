"""Collections that say when they change. Placement skips a pass in which nothing it reads has changed
(``placing.place_and_launch``), so "something changed" must follow from the change itself, never from a
caller remembering to say so: each collection placement reads is a :class:`TrackedDict` or
:class:`TrackedSet` bound to the state's :class:`Changes`, and every way of changing one marks it. A write
that changes nothing (the same value set again, an absent key popped) marks nothing, so a blocked queue
still costs no pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from typing import TYPE_CHECKING, Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")
D = TypeVar("D", bound="TrackedDict[Any, Any]")
S = TypeVar("S", bound="TrackedSet[Any]")

_ABSENT = object()


class Changes:
    """Counts the changes to what placement reads: compared between passes, its value means nothing."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def mark(self) -> None:
        self.count += 1


class TrackedDict(dict[K, V]):
    """A dict whose every change marks ``changes``."""

    __slots__ = ("changes",)

    def __init__(self, changes: Changes, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        super().__init__(items)
        self.changes = changes

    def __setitem__(self, key: K, value: V) -> None:
        if self.get(key, _ABSENT) is not value:
            super().__setitem__(key, value)
            self.changes.mark()

    def __delitem__(self, key: K) -> None:
        super().__delitem__(key)
        self.changes.mark()

    def pop(self, key: K, /, *default: Any) -> Any:
        if key in self:
            self.changes.mark()
        return super().pop(key, *default)

    def popitem(self) -> tuple[K, V]:
        item = super().popitem()
        self.changes.mark()
        return item

    def clear(self) -> None:
        if self:
            self.changes.mark()
        super().clear()

    def setdefault(self, key: K, default: Any = None, /) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: V) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self: D, other: Any, /) -> D:  # type: ignore[misc,override]  # as typeshed's dict
        self.update(other)
        return self


class TrackedSet(set[T]):
    """A set whose every change marks ``changes``."""

    __slots__ = ("changes",)

    def __init__(self, changes: Changes, items: Iterable[T] = ()) -> None:
        super().__init__(items)
        self.changes = changes

    def add(self, item: T) -> None:
        if item not in self:
            super().add(item)
            self.changes.mark()

    def discard(self, item: object) -> None:
        if item in self:
            super().discard(item)
            self.changes.mark()

    def remove(self, item: T) -> None:
        super().remove(item)
        self.changes.mark()

    def pop(self) -> T:
        item = super().pop()
        self.changes.mark()
        return item

    def clear(self) -> None:
        if self:
            self.changes.mark()
        super().clear()

    def update(self, *others: Iterable[T]) -> None:
        before = len(self)
        super().update(*others)
        if len(self) != before:
            self.changes.mark()

    def difference_update(self, *others: Iterable[Any]) -> None:
        before = len(self)
        super().difference_update(*others)
        if len(self) != before:
            self.changes.mark()

    def intersection_update(self, *others: Iterable[Any]) -> None:
        before = len(self)
        super().intersection_update(*others)
        if len(self) != before:
            self.changes.mark()

    def symmetric_difference_update(self, other: Iterable[T], /) -> None:
        items = set(other)
        super().symmetric_difference_update(items)
        if items:
            self.changes.mark()

    def __ior__(self: S, other: Set[Any], /) -> S:  # type: ignore[misc,override]  # as typeshed's set
        self.update(other)
        return self

    def __iand__(self: S, other: Set[Any], /) -> S:  # type: ignore[misc]  # as typeshed's set
        self.intersection_update(other)
        return self

    def __isub__(self: S, other: Set[Any], /) -> S:  # type: ignore[misc]  # as typeshed's set
        self.difference_update(other)
        return self

    def __ixor__(self: S, other: Set[Any], /) -> S:  # type: ignore[misc,override]  # as typeshed's set
        self.symmetric_difference_update(other)
        return self


class DictField(Generic[K, V]):
    """An attribute of the state that holds a :class:`TrackedDict`: assigning any mapping to it (a reload,
    say) wraps it in one bound to the owner's ``changes``, and is itself a change. It has no ``__get__`` at
    run time: the value lives in the instance's ``__dict__`` under the same name, so a read (10,000 a pass
    in placement's loops) costs no Python call."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    if TYPE_CHECKING:  # for the type checker only: reads find the instance's own entry (see above)

        def __get__(self, obj: Any, owner: type | None = None) -> TrackedDict[K, V]: ...

    def __set__(self, obj: Any, value: Mapping[K, V]) -> None:
        if obj.__dict__.get(self.name) is value:
            return  # `state.x |= ...` sets back what it changed in place (and marked)
        changes: Changes = obj.changes
        if not (isinstance(value, TrackedDict) and value.changes is changes):
            value = TrackedDict(changes, value)
        obj.__dict__[self.name] = value
        changes.mark()


class SetField(Generic[T]):
    """An attribute of the state that holds a :class:`TrackedSet` (as :class:`DictField` does a dict)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    if TYPE_CHECKING:  # reads find the instance's own entry, at a plain attribute's speed (see DictField)

        def __get__(self, obj: Any, owner: type | None = None) -> TrackedSet[T]: ...

    def __set__(self, obj: Any, value: Iterable[T]) -> None:
        if obj.__dict__.get(self.name) is value:
            return  # `state.x |= ...` sets back what it changed in place (and marked)
        changes: Changes = obj.changes
        if not (isinstance(value, TrackedSet) and value.changes is changes):
            value = TrackedSet(changes, value)
        obj.__dict__[self.name] = value
        changes.mark()

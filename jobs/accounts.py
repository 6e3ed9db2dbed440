"""Who people are, as the OS says: a uid's name, groups, and whether it may act on others' jobs.

Identity in gpuq always starts from a uid the kernel reported (a request file's owner, the caller's
own uid); nothing here trusts a name a user wrote.
"""

from __future__ import annotations

import grp
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

FRESH_FOR = 5.0  # seconds a look-up of users and groups is trusted: a root daemon follows a changed group soon


def _databases() -> tuple[int, ...]:
    """When the local user and group files last changed (a removed group member shows here at once)."""
    stamps = []
    for path in ("/etc/passwd", "/etc/group"):
        try:
            stamps.append(os.stat(path).st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


def _fresh(seconds: float, size: int) -> Callable[[Callable[[K], V]], Callable[[K], V]]:
    """Cache a one-argument look-up until /etc/passwd or /etc/group change, and for ``seconds`` (monotonic)
    at most (users and groups from a directory service change no local file): the daemon lives for months,
    and an admin removed from the admins group, or a user from a group, loses what it gave them at once."""

    def wrap(look_up: Callable[[K], V]) -> Callable[[K], V]:
        found: dict[K, tuple[float, tuple[int, ...], V]] = {}

        def cached(key: K) -> V:
            now, files = time.monotonic(), _databases()
            hit = found.get(key)
            if hit is not None and now - hit[0] < seconds and hit[1] == files:
                return hit[2]
            if len(found) >= size:
                found.clear()
            value = look_up(key)
            found[key] = (now, files, value)
            return value

        cached.__doc__ = look_up.__doc__
        return cached

    return wrap


@dataclass(frozen=True)
class Account:
    uid: int
    name: str
    gid: int  # primary group
    groups: tuple[int, ...]  # every group, primary included


@_fresh(FRESH_FOR, 512)
def account(uid: int) -> Account | None:
    """The account of ``uid``, or None for a uid with no passwd entry (a job can never run as it)."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    try:
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    except OSError:
        groups = (entry.pw_gid,)
    return Account(uid, entry.pw_name, entry.pw_gid, groups)


@_fresh(FRESH_FOR, 64)
def group_id(name: str | None) -> int | None:
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def is_admin(uid: int, admins: str | None) -> bool:
    """root, or a member of the configured admin group."""
    if uid == 0:
        return True
    gid = group_id(admins)
    if gid is None:
        return False
    found = account(uid)
    return found is not None and gid in found.groups


def may_act(uid: int, owner_uid: int, admins: str | None, queue_owner: int | None = None) -> bool:
    """May ``uid`` cancel, hold, release or update a job of ``owner_uid``? Its owner, the queue's own user
    (who runs a personal queue) and admins may."""
    return uid in (owner_uid, queue_owner) or is_admin(uid, admins)


@lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """A uid's login name, or the uid itself as text when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)

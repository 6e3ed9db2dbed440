"""Who people are, as the OS says: a uid's name, groups, and whether it may act on others' jobs.

Identity in gpuq always starts from a uid the kernel reported (a request file's owner, the caller's
own uid); nothing here trusts a name a user wrote.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Account:
    uid: int
    name: str
    gid: int  # primary group
    groups: tuple[int, ...]  # every group, primary included

    @property
    def is_root(self) -> bool:
        return self.uid == 0


@lru_cache(maxsize=512)
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


@lru_cache(maxsize=64)
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

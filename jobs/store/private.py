"""What only a job's owner and the admins may read in a shared queue: its command, cwd and environment.

In a shared queue everyone can read the job table (who runs what where, and how it ended), so the table
holds a *public* spec: the command replaced by a placeholder, no cwd, no environment. The real ones are
kept in ``private/<id>.json`` (one per job, or one per array), owned by the submitter and readable by the
admin group (by nobody else where none is configured; never by the submitter's own group). The daemon,
as root, reads them back whenever it needs the full spec (after a restart, for a retry); ``gpuq show``
merges them in when the caller may read them. The daemon writes a job's file once, when it gives the job its
id, and never again; whoever reads one refuses it unless the job's owner owns it (``Refused``): a file that
another user came to own (as 34565a6's daemon let a replayed token do) never runs as the job's owner.

A personal queue is private as a whole (its directory is the user's own) and keeps full specs in the table.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import stat
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir

HIDDEN = "(private)"
MAX_BYTES = 8 << 20  # as a spool request (``spool.MAX_REQUEST_BYTES``), which these fields came from
FIELDS = ("command", "cwd", "env", "python", "notify")


def public(spec: JobSpec) -> JobSpec:
    """The spec as everyone may see it: its name, shape and limits, not what it runs or with what."""
    return dataclasses.replace(
        spec, command=(HIDDEN,), cwd="", env={}, python=None, notify=None, name=spec.display_name
    )


def is_public(spec: JobSpec) -> bool:
    return spec.command == (HIDDEN,) and spec.cwd == ""


class Refused(BadInput):
    """A private file that is not its job owner's: it is not believed (``gpuq doctor`` names it)."""


class PrivateSpecs:
    """The daemon's access to the private parts of specs (it runs as root in a shared queue)."""

    def __init__(self, state: StateDir, admin_gid: int | None = None) -> None:
        self.state = state
        self.admin_gid = admin_gid
        self._cache: dict[int, dict[str, Any]] = {}

    def write(self, owner_id: int, spec: JobSpec, uid: int, gid: int) -> None:
        """Keep ``spec``'s private fields for a job (or array) ``owner_id``, durably: its request goes next."""
        path = self.state.private_file(owner_id)
        data = spec.to_json()
        write_atomic(path, json.dumps({key: data[key] for key in FIELDS}).encode())
        # Its owner and the admin group only: never the owner's own group, which teammates often share.
        os.chown(path, uid, gid if self.admin_gid is None else self.admin_gid)
        os.chmod(path, 0o600 if self.admin_gid is None else 0o640)
        self._cache[owner_id] = {key: data[key] for key in FIELDS}

    def restore(self, spec: JobSpec, owner_id: int, uid: int, array_index: int | None = None) -> JobSpec:
        """The full spec of a job of ``uid`` whose table row holds the public one (already full: as is)."""
        if not is_public(spec):
            return spec
        return merge(spec, self.fields(owner_id, uid), array_index)

    def fields(self, owner_id: int, uid: int) -> dict[str, Any]:
        """The private fields of job (or array) ``owner_id`` of user ``uid``, read once while it is active."""
        found = self._cache.get(owner_id)
        if found is None:
            found = self._cache[owner_id] = read(self.state, owner_id, uid)
        return found

    def forget(self, owner_id: int) -> None:
        self._cache.pop(owner_id, None)


def read(state: StateDir, owner_id: int, uid: int) -> dict[str, Any]:
    """The private fields of job (or array) ``owner_id``, whose owner is ``uid``. Raises PermissionError for
    other users' jobs, ``Refused`` for a file that is not ``uid``'s (a link, or another user's)."""
    path = state.private_file(owner_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise BadInput(f"the private part of job {owner_id} ({path}) is missing") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise Refused(f"the private part of job {owner_id} ({path}) is a link: refused") from None
        raise
    try:
        problem = not_owned(os.fstat(fd), uid)
        if problem:
            raise Refused(f"the private part of job {owner_id} ({path}) {problem}: refused, it does not run")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read()
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
    except ValueError:
        raise BadInput(f"the private part of job {owner_id} ({path}) is damaged") from None
    if not isinstance(data, dict):
        raise BadInput(f"the private part of job {owner_id} ({path}) is damaged")
    return data


def not_owned(found: os.stat_result, uid: int) -> str:
    """Why a private file is not one the daemon wrote for a job of ``uid`` ("" if it is): a plain file that
    ``uid`` owns (the daemon writes it so, once, and no request rewrites it)."""
    if not stat.S_ISREG(found.st_mode):
        return "is not a plain file"
    if found.st_uid != uid:
        return f"belongs to uid {found.st_uid}, not to the job's owner (uid {uid})"
    if found.st_size > MAX_BYTES:  # its owner may write it: root reads no more than a request could hold
        return f"is {found.st_size} bytes, more than a job's command and environment can be"
    return ""


def merge(spec: JobSpec, fields: dict[str, Any], array_index: int | None = None) -> JobSpec:
    """A public spec with its private fields put back (an array's template, made the member's own)."""
    full = JobSpec.from_json({**spec.to_json(), **{k: fields.get(k) for k in FIELDS}})
    return full if array_index is None else full.member(array_index)

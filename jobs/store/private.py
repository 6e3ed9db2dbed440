"""What only a job's owner and the admins may read in a shared queue: its command, cwd and environment.

In a shared queue everyone can read the job table (who runs what where, and how it ended), so the table
holds a *public* spec: the command replaced by a placeholder, no cwd, no environment. The real ones are
kept in ``private/<id>.json`` (one per job, or one per array), owned by the submitter and readable by the
admin group (by nobody else where none is configured; never by the submitter's own group). The daemon,
as root, reads them back whenever it needs the full spec (after a restart, for a retry); ``gpuq show``
merges them in when the caller may read them.

A personal queue is private as a whole (its directory is the user's own) and keeps full specs in the table.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store.statedir import StateDir, read_bytes, write_atomic

HIDDEN = "(private)"
FIELDS = ("command", "cwd", "env", "python", "notify")


def public(spec: JobSpec) -> JobSpec:
    """The spec as everyone may see it: its name, shape and limits, not what it runs or with what."""
    return dataclasses.replace(spec, command=(HIDDEN,), cwd="", env={}, python=None, notify=None,
                               name=spec.display_name)  # fmt: skip


def is_public(spec: JobSpec) -> bool:
    return spec.command == (HIDDEN,) and spec.cwd == ""


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

    def restore(self, spec: JobSpec, owner_id: int, array_index: int | None = None) -> JobSpec:
        """The full spec of a job whose table row holds the public one (already full: returned as is)."""
        if not is_public(spec):
            return spec
        return merge(spec, self.fields(owner_id), array_index)

    def fields(self, owner_id: int) -> dict[str, Any]:
        """The private fields of job (or array) ``owner_id``, read once while it is active."""
        found = self._cache.get(owner_id)
        if found is None:
            found = self._cache[owner_id] = read(self.state, owner_id)
        return found

    def forget(self, owner_id: int) -> None:
        self._cache.pop(owner_id, None)


def read(state: StateDir, owner_id: int) -> dict[str, Any]:
    """The private fields of job (or array) ``owner_id``. Raises PermissionError for other users' jobs."""
    path = state.private_file(owner_id)
    try:
        data = json.loads(read_bytes(path))
    except FileNotFoundError:
        raise BadInput(f"the private part of job {owner_id} ({path}) is missing") from None
    except ValueError:
        raise BadInput(f"the private part of job {owner_id} ({path}) is damaged") from None
    if not isinstance(data, dict):
        raise BadInput(f"the private part of job {owner_id} ({path}) is damaged")
    return data


def merge(spec: JobSpec, fields: dict[str, Any], array_index: int | None = None) -> JobSpec:
    """A public spec with its private fields put back (an array's template, made the member's own)."""
    full = JobSpec.from_json({**spec.to_json(), **{k: fields.get(k) for k in FIELDS}})
    return full if array_index is None else full.member(array_index)

"""The drop box between clients and the daemon: one request file per submit or cancel.

A client writes a request to a temp name and renames it in; the daemon reads it, acts on it in one
transaction, and only then deletes it, so a request is never lost and, because ingesting is idempotent,
never acted on twice: a personal queue's submit carries the id its client reserved, a shared queue's is
named by a token, and the id the daemon gives it is recorded with the token (``JobTable.intake_ids``).
Who sent a request is the file's owner, as the OS reports it, never a field inside the file.

Clients write through ``jobs.store.outbox`` (light enough for the quick ``gpuq submit`` path); this module is the
daemon's side: it reads requests back into typed values, and sets aside what it cannot read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

from gpuq_scheduler.jobs.errors import BadInput, StateDirError
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store import checks
from gpuq_scheduler.jobs.store.action_values import ActionValues
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import REJECTED, REQUEST_SCHEMA, SPOOL, StateDir

MAX_REQUEST_BYTES = 8 << 20  # a request holds a command line and an environment: far less than this
MAX_ID = (1 << 63) - 1  # the job table's largest integer: an id beyond it could never be recorded
V = TypeVar("V")


@dataclass(frozen=True)
class ArrayPlan:
    """An array submit: its members' indices and how many may run at once (None: no limit).

    The array takes the request's id; member k takes id + 1 + k.
    """

    indices: tuple[int, ...]
    throttle: int | None = None

    def member_ids(self, array_id: int) -> range:
        return range(array_id + 1, array_id + 1 + len(self.indices))


@dataclass(frozen=True)
class SubmitRequest:
    """``token``: a shared queue's request is named by one and has no id (``job_id`` 0) until the daemon
    gives it one; a personal queue's carries its id (``token`` None)."""

    path: str  # a request's file is named by a string (jobs.store.statedir says why)
    uid: int
    job_id: int
    spec: JobSpec
    submitted_at: float
    array: ArrayPlan | None = None
    token: str | None = None


@dataclass(frozen=True)
class ControlRequest:
    """hold, release, update, suspend, resume (jobs); drain, undrain, pause, unpause (the queue); reserve,
    unreserve."""

    path: str
    uid: int
    action: Action
    ids: tuple[int, ...]
    values: ActionValues | None  # read and checked whole as its action's type when the request was read

    def values_as(self, kind: type[V]) -> V:
        """Its values as ``kind``, the type its action carries (``action_values.CARRIES``): the spool reads
        nothing else for that action, so another type here is gpuq's own mistake, never a user's."""
        if not isinstance(self.values, kind):
            raise TypeError(f"this {self.action} request carries {type(self.values).__name__}, not {kind.__name__}")
        return self.values


@dataclass(frozen=True)
class CancelRequest:
    path: str
    uid: int
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class BadRequest:
    """A file in the spool that is not a request we can act on; the daemon sets it aside."""

    path: str
    reason: str


Request = SubmitRequest | CancelRequest | ControlRequest | BadRequest


def scan(state: StateDir, per_owner: int | None = None) -> tuple[list[Request], bool]:
    """The requests in the spool, submits in id order first, then cancels; and whether any were left for later.

    ``per_owner`` (a shared queue's daemon): read at most that many files of each owner (the kernel's, as
    the directory lists them), the oldest first. One user's flood of requests is then read over several
    passes, and every other user's requests are in the first: the pass that answers them stays short.
    """
    spool = state.at(SPOOL)
    try:
        entries = [e for e in os.scandir(spool) if not e.name.startswith(".") and e.name != REJECTED]
    except OSError as err:
        raise StateDirError(f"cannot read the spool {spool}: {err.strerror}") from None
    left = False
    if per_owner is not None:
        by_owner: dict[int, list[tuple[float, str]]] = {}
        for entry in entries:
            try:
                found = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed: read (or not) as it stands next pass
            by_owner.setdefault(found.st_uid, []).append((found.st_mtime, entry.name))
        names: list[str] = []
        for files in by_owner.values():
            files.sort()
            names.extend(name for _, name in files[:per_owner])
            left = left or len(files) > per_owner
    else:
        names = [e.name for e in entries]
    requests = [read_request(os.path.join(spool, name)) for name in sorted(names)]
    return sorted(requests, key=lambda r: (not isinstance(r, SubmitRequest), os.path.basename(r.path))), left


def read_request(where: str | os.PathLike[str]) -> Request:
    """Read one spool file defensively: it may be anything a user (or a disk error) put there."""
    path = os.fspath(where)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return BadRequest(path, "is a symbolic link")
        return BadRequest(path, f"cannot be opened: {err.strerror}")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return BadRequest(path, "is not a regular file")
        if info.st_nlink != 1:
            return BadRequest(path, "has several hard links (a planted link, not a request)")
        if info.st_size > MAX_REQUEST_BYTES:
            return BadRequest(path, f"is {info.st_size} bytes, more than a request can be")
        raw = _read_all(fd, info.st_size)
        return _checked(_parse(path, info.st_uid, raw))
    finally:
        os.close(fd)


def _read_all(fd: int, size: int) -> bytes:
    """The file's bytes, never more than a request can be (it may grow while read). One read where it stands
    still: a buffered reader allocated 8 MB for each request, and every submit to an idle queue waits for it."""
    chunks, left = [], MAX_REQUEST_BYTES + 1
    while left > 0:
        chunk = os.read(fd, min(left, max(size + 1, 4096)))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _parse(path: str, uid: int, raw: bytes) -> Request:
    try:
        body: Any = json.loads(raw)
    except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than any request is
        return BadRequest(path, f"is not JSON ({err})")
    if not isinstance(body, dict):
        return BadRequest(path, "is not a JSON object")
    if body.get("schema") != REQUEST_SCHEMA:
        schema = body.get("schema")
        shown = repr(schema) if isinstance(schema, (int, float, str)) or schema is None else type(schema).__name__
        return BadRequest(path, f"has schema {shown[:40]}; this gpuq reads {REQUEST_SCHEMA}")
    kind, name = body.get("kind"), os.path.basename(path)
    try:
        if kind == "submit" and name.startswith("submit-"):
            job_id, submitted_at, token = body.get("id"), body.get("submitted_at"), token_of(name)
            if token is not None:
                job_id = 0  # whatever it says: the daemon gives it its id
            elif not _is_id(job_id) or name != f"submit-{job_id:012d}.json":
                return BadRequest(path, "has an id that does not match its file name")
            submitted = _finite(submitted_at)
            if submitted is None:
                return BadRequest(path, "lacks a submit time")
            spec_json = body.get("spec")
            if not isinstance(spec_json, dict):
                return BadRequest(path, "lacks a job spec")
            array = _array(body.get("array"))
            if isinstance(array, str):
                return BadRequest(path, array)
            return SubmitRequest(path, uid, job_id, JobSpec.from_json(spec_json), submitted, array, token)
        if kind == "cancel" and name.startswith("cancel-"):
            ids = body.get("ids")
            if not isinstance(ids, list) or not all(_is_id(i) for i in ids):
                return BadRequest(path, "has ids that are not a list of job ids")
            return CancelRequest(path, uid, tuple(ids))
        if kind == "control" and name.startswith("control-"):
            action, ids, values = body.get("action"), body.get("ids"), body.get("values")
            if action not in ACTIONS:
                return BadRequest(path, f"asks for an unknown action {str(action)[:40]!r}")
            if not isinstance(ids, list) or not all(_is_id(i) or i == 0 for i in ids):
                return BadRequest(path, "has ids that are not a list of job or GPU ids")
            if not isinstance(values, dict):
                return BadRequest(path, "has values that are not an object")
            asked, named = ACTIONS[action], tuple(ids)
            return ControlRequest(path, uid, asked, named, checks.control(asked, named, values))
    except BadInput as err:
        return BadRequest(path, str(err))
    return BadRequest(path, f"is not a request gpuq knows (kind {kind!r})")


ACTIONS = {action.value: action for action in Action}  # by the word a request file holds


def token_of(name: str) -> str | None:
    """The token a shared queue's submit request is named by (``submit-<32 hex digits>.json``), if it is."""
    token = name[len("submit-") : -len(".json")] if name.startswith("submit-") and name.endswith(".json") else ""
    return token if len(token) == 32 and all(c in "0123456789abcdef" for c in token) else None


def _checked(request: Request) -> Request:
    """The request held whole to the rules (``jobs.store.checks``), or a BadRequest saying which it breaks."""
    try:
        if isinstance(request, SubmitRequest):
            plan = request.array
            indices, throttle = (None, None) if plan is None else (plan.indices, plan.throttle)
            spec = checks.submit(request.spec, request.submitted_at, indices, throttle)
            return dataclasses.replace(request, spec=spec)
        if isinstance(request, CancelRequest):
            checks.ids(request.job_ids)
    except BadInput as err:
        return BadRequest(request.path, str(err))
    return request


def _is_id(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID


def _finite(value: Any) -> float | None:
    """A time as a float, or None if it is not a finite number (the table cannot store NaN or 1e400)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _array(data: Any) -> ArrayPlan | str | None:
    """The array part of a submit request, or a string saying what is wrong with it."""
    if data is None:
        return None
    if not isinstance(data, dict):
        return "has an array that is not an object"
    indices, throttle = data.get("indices"), data.get("throttle")
    if (
        not isinstance(indices, list)
        or not indices
        or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_ID for i in indices)
    ):
        return "has array indices that are not a list of numbers"
    if throttle is not None and (not isinstance(throttle, int) or isinstance(throttle, bool) or throttle < 1):
        return "has an array throttle that is not a positive number"
    return ArrayPlan(tuple(indices), throttle)


def pending_submits(state: StateDir) -> Iterator[SubmitRequest]:
    """Submits the daemon has not ingested yet, so readers can show them before it wakes (not a shared
    queue's: they have no id until the daemon reads them)."""
    for request in scan(state)[0]:
        if isinstance(request, SubmitRequest) and request.token is None:
            yield request


def remove(request: Request) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(request.path)


def set_aside(state: StateDir, bad: BadRequest) -> str:
    """Move a bad request out of the way (never delete what a user wrote) with a note saying why."""
    target = state.at(SPOOL, REJECTED, f"{os.path.basename(bad.path)}.{os.urandom(4).hex()}")
    try:
        os.rename(bad.path, target)
        write_atomic(target + ".why", (bad.reason + "\n").encode(), durable=False)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(bad.path)  # cannot move it (cross-device?): removing it keeps the daemon going
    return target

"""What `gpuq suspend` and `gpuq resume` ask of the daemon, checked before it is asked: every job named must
be the caller's to act on (or the caller the queue's owner or an admin), and in the state the action takes
a job from, or nothing is written. The daemon carries the request out (``launcher.daemon.suspension.suspending``) and
checks who asked again, from the request file's owner.

Light on purpose (no job model, dataclasses, enum or typing at run time): the quick `gpuq suspend` path
(``launcher.cli.suspend``) runs it, and so does click's command. A job named is read straight from the table
(sqlite3 alone) as a ``Named``. What is not that plain case (an id the table does not hold: a submit still in
the spool, an unknown id; a table of another version, or one that cannot be opened as it is; jobs sent to
clusters) is looked up by the queue's ``resolve`` instead, whose records become the same ``Named``. So the
rules below see one kind of value and are written once, whichever way the jobs were found.
"""

from __future__ import annotations

import os

from gpuq_scheduler.jobs.errors import BadInput, NotPermitted
from gpuq_scheduler.jobs.store import outbox, rights
from gpuq_scheduler.jobs.store.statedir import CLUSTERS_DB, DB, TABLE_VERSION, StateDir

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from gpuq_scheduler.jobs.model import JobRecord
    from gpuq_scheduler.jobs.store.actions import Action

# The state each action takes a job from, as the table writes it (``JobState``'s values); by Action.SUSPEND's
# and Action.RESUME's values, compared as strings (an Action is one): the quick `gpuq suspend` loads no enum.
SOURCE = {"suspend": "running", "resume": "suspended"}


class Named:
    """What suspend and resume look at of a job: whose it is, its state, and (for the MPS check) the GPUs
    it holds and what it asked for."""

    __slots__ = ("gpus", "id", "mem_per_gpu", "state", "uid", "user", "want_gpus")

    def __init__(
        self, id: int, state: str, uid: int, user: str, gpus: tuple[int, ...], want_gpus: int, mem_per_gpu: int | None
    ) -> None:
        self.id, self.state, self.uid, self.user = id, state, uid, user
        self.gpus, self.want_gpus, self.mem_per_gpu = gpus, want_gpus, mem_per_gpu

    @classmethod
    def of(cls, record: JobRecord) -> Named:
        spec = record.spec
        return cls(record.id, record.state.value, record.uid, record.user, record.gpus, spec.gpus, spec.mem_per_gpu)

    def fields(self) -> tuple[int, str, int, str, tuple[int, ...], int, int | None]:
        return self.id, self.state, self.uid, self.user, self.gpus, self.want_gpus, self.mem_per_gpu

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Named) and other.fields() == self.fields()

    def __hash__(self) -> int:
        return hash(self.fields())

    def __repr__(self) -> str:
        return f"Named{self.fields()!r}"


def ask(
    state: StateDir,
    action: Action,
    ids: Iterable[int],
    *,
    resolve: Callable[[list[int]], Iterable[JobRecord]],
    refuse: Callable[[list[Named]], None] | None = None,
    uid: int | None = None,
) -> list[Named]:
    """Ask the daemon to suspend running jobs to host memory, or (``action="resume"``) to resume suspended
    ones (an array id stands for its members), and return the jobs asked for. Refuses before writing
    anything: another's job (unless the caller is the queue's owner or an admin), a job in neither state, and
    what ``refuse`` raises for the jobs chosen. ``resolve`` is the queue's (``Queue.resolve``), for what the
    table alone does not answer."""
    uid = os.getuid() if uid is None else uid
    wanted = list(dict.fromkeys(ids))
    named = in_table(state, wanted)
    if named is None:
        named = [Named.of(record) for record in resolve(wanted)]
    source = SOURCE[action]
    for job in named:
        if not rights.may_act(state, uid, job.uid):
            raise NotPermitted(f"job {job.id} belongs to {job.user}; only {job.user} or an admin can {action} it")
    # One job named twice over (an array and a member of it) is asked for, and said, once.
    chosen = list({job.id: job for job in named if job.state == source}.values())
    by_id = {job.id: job for job in named}
    for job_id in wanted:
        found = by_id.get(job_id)
        if found is not None and found.state != source:
            how = "suspend a running one" if action == "suspend" else "resume a suspended one"
            live = found.state in ("pending", "running", "suspended")  # the rest are the ways a job ends
            said = f"is {found.state}" if live else f"has ended ({found.state})"
            raise BadInput(f"job {job_id} {said}; `gpuq {action}` can only {how}")
    if not chosen:
        raise BadInput(f"no {source} job among {', '.join(map(str, wanted))}; nothing to {action}")
    if refuse is not None:
        refuse(chosen)
    outbox.write_control(state, action, [job.id for job in chosen])
    return chosen


# A Named's columns, in its order, then the job's array.
_COLUMNS = "id, state, uid, user, gpus, want_gpus, mem_per_gpu, array_id"


def in_table(state: StateDir, ids: Sequence[int]) -> list[Named] | None:
    """The jobs ``ids`` name, in ``Queue.resolve``'s order (each array's members, then the jobs named by
    their own ids), read straight from the job table; None where that is not the plain case (the module's
    doc says which), for ``resolve`` to answer."""
    ids = list(dict.fromkeys(ids))  # as resolve: a job named twice is named once
    if not ids or not state.exists() or os.path.exists(state.at(CLUSTERS_DB)) or not os.path.exists(state.at(DB)):
        return None
    import sqlite3  # ~2 ms, and only here: the module is imported by commands that never read the table

    marks = ",".join("?" * len(ids))
    try:
        db = sqlite3.connect(state.at(DB), isolation_level=None, timeout=30)  # as jobs.store.schema.connect
        try:
            if db.execute("PRAGMA user_version").fetchone()[0] != TABLE_VERSION:
                return None  # one no daemon of this version opened yet (or a newer one): the full read says
            arrays = {row[0] for row in db.execute(f"SELECT id FROM arrays WHERE id IN ({marks})", ids)}
            query = f"SELECT {_COLUMNS} FROM jobs WHERE id IN ({marks}) OR array_id IN ({marks}) ORDER BY id"
            rows = db.execute(query, [*ids, *ids]).fetchall()
        finally:
            db.close()
        members: dict[int, list[Named]] = {}
        own: dict[int, Named] = {}
        asked = set(ids)
        for row in rows:
            job = _named(row)
            if row[7] in arrays:
                members.setdefault(row[7], []).append(job)
            if row[0] in asked:  # a member named by its own id too: twice, as resolve has it
                own[row[0]] = job
    except (sqlite3.Error, OverflowError, ValueError, TypeError):  # an id past SQLite's integers; a damaged row
        return None
    if any(i not in arrays and i not in own for i in ids):
        return None  # in the spool, or unknown: resolve says which
    return [job for i in ids if i in arrays for job in members.get(i, [])] + [own[i] for i in ids if i not in arrays]


def _named(row: Sequence[object]) -> Named:
    job_id, job_state, uid, user, gpus, want_gpus, mem = row[:7]
    if not (isinstance(job_id, int) and isinstance(job_state, str) and isinstance(uid, int) and isinstance(user, str)):
        raise TypeError("a job row gpuq cannot read")
    if not (isinstance(gpus, str) and isinstance(want_gpus, int) and (mem is None or isinstance(mem, int))):
        raise TypeError("a job row gpuq cannot read")
    held = tuple(int(gpu) for gpu in gpus.strip("[] ").split(",")) if gpus.strip("[] ") else ()
    return Named(job_id, job_state, uid, user, held, want_gpus, mem)

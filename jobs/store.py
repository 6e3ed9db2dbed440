"""The queue as clients see it: submit, cancel, get, list. Works whether or not the daemon is up.

Writes go through the spool (the daemon is the table's only writer); reads merge the table with
submits the daemon has not ingested yet, so a job is visible from the moment ``submit`` returns.
"""

from __future__ import annotations

import json
import os
import pwd
import time
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

from jobs import spool
from jobs.errors import BadInput, NotPermitted, StateDirError, UnknownJob
from jobs.model import JobRecord, JobSpec, JobState
from jobs.statedir import StateDir
from jobs.submission import Inventory

if TYPE_CHECKING:
    from jobs.table import JobTable


@lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Queue:
    """One state directory, seen from a client."""

    def __init__(self, state: StateDir) -> None:
        self.state = state

    # -- writes -----------------------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, now: float | None = None) -> int:
        """Queue one job durably and return its id. The daemon is not needed for this to succeed."""
        self.state.ensure()
        inventory = self.inventory()
        if inventory is not None:
            inventory.check(spec)
        job_id = spool.allocate_ids(self.state)
        spool.write_submit(self.state, job_id, spec, time.time() if now is None else now)
        return job_id

    def cancel(self, job_ids: Iterable[int], *, uid: int | None = None) -> list[int]:
        """Ask the daemon to cancel jobs. Refuses unknown ids and other users' jobs before writing anything.

        Returns the ids that were still active (finished ones need no cancel and are skipped).
        """
        uid = os.getuid() if uid is None else uid
        ids = list(dict.fromkeys(job_ids))
        active = []
        for record in self._records(ids):
            if uid not in (0, record.uid):
                raise NotPermitted(
                    f"job {record.id} belongs to {record.user}; only {record.user} or an admin can cancel it"
                )
            if not record.state.finished:
                active.append(record.id)
        if active:
            spool.write_cancel(self.state, active)
        return active

    def wake_daemon(self) -> bool:
        """Nudge the daemon to act now; False when none is running."""
        return self.state.exists() and spool.poke(self.state)

    # -- reads ------------------------------------------------------------------------------------

    def table(self) -> JobTable:
        from jobs.table import JobTable  # sqlite3 costs ~10 ms to import: only readers pay for it

        return JobTable(self.state.db)

    def get(self, job_id: int) -> JobRecord:
        return self._records([job_id])[0]

    def records(self, *, active_only: bool = False, limit: int | None = None) -> list[JobRecord]:
        table = self.table()
        try:
            records = {r.id: r for r in table.records(active_only=active_only, limit=limit)}
        finally:
            table.close()
        for record in self._spooled():
            records.setdefault(record.id, record)
        return [records[i] for i in sorted(records)]

    def rejected(self) -> int:
        """How many spool files the daemon set aside as unreadable."""
        try:
            return sum(1 for entry in os.scandir(self.state.rejected) if entry.name.endswith(".why"))
        except OSError:
            return 0

    def inventory(self) -> Inventory | None:
        """The GPUs the daemon last saw (from ``gpus.json``), or None if it has never run here."""
        try:
            data = json.loads(self.state.inventory.read_bytes())
            return Inventory(tuple(int(gpu["total"]) for gpu in data["gpus"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _records(self, job_ids: list[int]) -> list[JobRecord]:
        if not self.state.exists():
            if not self.state.root.exists():
                raise UnknownJob(job_ids[0]) if job_ids else BadInput("no job ids given")
            raise StateDirError(f"{self.state.root} is not a gpuq state directory; check GPUQ_HOME")
        table = self.table()
        try:
            found = {i: r for i in job_ids if (r := table.get(i)) is not None}
        finally:
            table.close()
        missing = [i for i in job_ids if i not in found]
        if missing:
            spooled = {r.id: r for r in self._spooled()}
            for job_id in missing:
                if job_id not in spooled:
                    raise UnknownJob(job_id)
                found[job_id] = spooled[job_id]
        return [found[i] for i in job_ids]

    def _spooled(self) -> list[JobRecord]:
        if not self.state.spool.is_dir():
            return []
        return [
            JobRecord(
                id=request.job_id,
                spec=request.spec,
                uid=request.uid,
                user=user_name(request.uid),
                state=JobState.PENDING,
                submitted_at=request.submitted_at,
                log=str(self.state.log(request.job_id)),
            )
            for request in spool.pending_submits(self.state)
        ]

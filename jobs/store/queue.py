"""The queue as clients see it: submit, cancel, get, list. Works whether or not the daemon is up.

Writes go through the spool (the daemon is the table's only writer); reads merge the table with
submits the daemon has not ingested yet, so a job is visible from the moment ``submit`` returns.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.errors import BadInput, NotPermitted, StateDirError, UnknownJob
from gpuq_scheduler.jobs.listing import Line
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.options import PIDS
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store import outbox, rights, spool
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.submission import Inventory, check_host_limits, host_limits

if TYPE_CHECKING:
    from gpuq_scheduler.jobs.store.action_values import Update
    from gpuq_scheduler.jobs.store.table import JobTable


class Queue:
    """One state directory, seen from a client."""

    def __init__(self, state: StateDir) -> None:
        self.state = state

    # -- writes -----------------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec,
        *,
        array: spool.ArrayPlan | None = None,
        now: float | None = None,
        patience: float | None = outbox.ANSWER_PATIENCE,
    ) -> int:
        """Queue one job (or an array: its id, then one id per member) durably and return its id.

        The daemon is not needed for the job to be queued; in a shared queue it gives the id, and without it
        NoIdYet says the job is queued with none yet (``patience``: ``outbox.post_submit``). Dependencies must
        name jobs or arrays that exist.
        """
        self.state.ensure()
        inventory = self.inventory()
        if inventory is not None:
            inventory.check(spec)
        limits = {"cpus": spec.cpus, "ram": spec.ram, "pids": spec.value(PIDS)}
        if any(value is not None for value in limits.values()):
            self._learn_host_limits()
            check_host_limits(limits, self.state.inventory)
        if spec.after:
            self.resolve(spec.after)
        if self.state.is_foreign():
            self._check_caps(spec, 1 if array is None else len(array.indices))
        plan = None if array is None else (array.indices, array.throttle)
        submitted_at = time.time() if now is None else now
        return outbox.post_submit(self.state, spec.to_json(), plan, submitted_at=submitted_at, patience=patience)

    def control(
        self, action: Action, ids: Iterable[int], values: Update | None = None, *, uid: int | None = None
    ) -> list[JobRecord]:
        """hold, release or update jobs (an array id stands for its members). Owner or admin only.

        Returns the pending jobs the request applies to; refuses before writing anything.
        """
        uid = os.getuid() if uid is None else uid
        records = self.resolve(list(ids))
        for record in records:
            if not self._may_act(uid, record):
                raise NotPermitted(
                    f"job {record.id} belongs to {record.user}; only {record.user} or an admin can {action} it"
                )
        if values is not None and values.time_limit is not None and self.state.is_foreign():
            self._check_time(values.time_limit)
        pending = [r for r in records if r.state is JobState.PENDING]
        if pending:
            outbox.write_control(self.state, action, [r.id for r in pending], values)
        return pending

    def control_queue(self, action: Action, gpus: Iterable[int] = (), *, uid: int | None = None) -> None:
        """drain/undrain GPUs, pause/unpause the queue: for whoever runs the daemon, or root."""
        uid = os.getuid() if uid is None else uid
        self.state.ensure()
        owner = self.state.owner()
        if not accounts.may_act(uid, owner, self._admins(), owner):
            raise NotPermitted(f"only {accounts.user_name(owner)} (who runs this queue) or an admin can {action} it")
        inventory = self.inventory()
        for gpu in gpus:
            if gpu < 0 or (inventory is not None and gpu >= len(inventory.totals)):
                count = "?" if inventory is None else len(inventory.totals) - 1
                raise BadInput(f"no GPU {gpu} here; GPUs are numbered 0 to {count} (`gpuq gpus` lists them)")
        outbox.write_control(self.state, action, list(gpus))

    def cancel(self, job_ids: Iterable[int], *, uid: int | None = None) -> list[int]:
        """Ask the daemon to cancel jobs. Refuses unknown ids and other users' jobs before writing anything.

        Returns the ids that were still active (finished ones need no cancel and are skipped).
        """
        uid = os.getuid() if uid is None else uid
        ids = list(dict.fromkeys(job_ids))
        active = []
        for record in self.resolve(ids):
            if not self._may_act(uid, record):
                raise NotPermitted(
                    f"job {record.id} belongs to {record.user}; only {record.user} or an admin can cancel it"
                )
            if not record.state.finished:
                active.append(record.id)
        if active:
            outbox.write_cancel(self.state, active)
        return active

    def _learn_host_limits(self, patience: float = 60.0) -> None:
        """A personal queue whose daemon has never run cannot yet say which host limits it can enforce: start
        its daemon, as this submit would anyway, and wait for it to record them (its first pass, a second or
        so). A first `gpuq submit --cpus 4` was refused with "start the daemon, then submit again"."""
        if host_limits(self.state.inventory) is not None or self.state.is_foreign():
            return
        outbox.ensure_daemon(self.state)
        deadline = time.monotonic() + patience  # a bound for a daemon that fails to start; check_host_limits says
        while host_limits(self.state.inventory) is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def _check_caps(self, spec: JobSpec, jobs: int) -> None:
        """A shared queue's per-user limits, refused here with a clear line (the daemon enforces them too)."""
        from gpuq_scheduler.jobs import config

        shared = config.load().shared
        if spec.time_limit is not None:
            self._check_time(spec.time_limit)
        pids, most_pids = spec.value(PIDS), shared.max_pids
        if pids is not None and most_pids is not None and pids > most_pids:
            raise BadInput(f"--pids {pids}: this queue allows at most {most_pids} processes per job; ask for less")
        most = shared.max_gpus_per_user
        if most is not None and spec.gpus > most:
            raise BadInput(f"--gpus {spec.gpus}: this queue lets a user hold at most {most} GPUs at once")
        cap = shared.max_queued_per_user
        if cap is not None:
            table = self.table()
            try:
                queued = table.count_pending(os.getuid())
            finally:
                table.close()
            if queued + jobs > cap:
                raise BadInput(
                    f"you have {queued} jobs waiting and this queue takes at most {cap} per user; "
                    "wait for some to start, or cancel some"
                )

    def _check_time(self, seconds: float) -> None:
        """A shared queue's max_time, refused here with a clear line (the daemon enforces it too)."""
        from gpuq_scheduler.jobs import config
        from gpuq_scheduler.jobs.units import format_duration

        longest = config.load().shared.max_time
        if longest is not None and seconds > longest:
            raise BadInput(
                f"--time {format_duration(seconds)}: this queue allows at most {format_duration(longest)}; "
                "ask for less, or split the work"
            )

    def _may_act(self, uid: int, record: JobRecord) -> bool:
        return rights.may_act(self.state, uid, record.uid)

    def _admins(self) -> str | None:
        from gpuq_scheduler.jobs import config

        return config.load().shared.admins

    # -- reads ------------------------------------------------------------------------------------

    def table(self) -> JobTable:
        from gpuq_scheduler.jobs.store.table import JobTable  # sqlite3 costs ~10 ms to import: only readers pay for it

        return JobTable(self.state.db)

    def get(self, job_id: int) -> JobRecord:
        return self._records([job_id])[0]

    def details(self, job_id: int) -> JobRecord:
        """A job with its command, cwd and environment where the caller may read them (in a shared queue
        the table holds only what everyone may see; the rest is in a file for its owner and admins)."""
        from gpuq_scheduler.jobs.store import private

        record = self.get(job_id)
        if not private.is_public(record.spec):
            return record
        try:
            fields = private.read(self.state, record.id if record.array_id is None else record.array_id, record.uid)
        except (PermissionError, BadInput):
            return record
        return record.replace(spec=private.merge(record.spec, fields, record.array_index))

    def resolve(self, ids: Iterable[int]) -> list[JobRecord]:
        """The jobs named by ``ids``, where an array's id stands for all its members."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        _check_ids(wanted)
        table = self.table()
        try:
            arrays = table.arrays(wanted)
            spooled_arrays: dict[int, list[JobRecord]] = {}
            if any(i not in arrays for i in wanted):
                for record in self._spooled():
                    if record.array_id is not None:
                        spooled_arrays.setdefault(record.array_id, []).append(record)
                late = [i for i in wanted if i not in arrays and i not in spooled_arrays]
                if late:
                    arrays.update(table.arrays(late))  # ingested while we read the spool
            members = {a: table.members(a) for a in arrays}
        finally:
            table.close()
        found: list[JobRecord] = []
        plain = [i for i in wanted if i not in arrays and i not in spooled_arrays]
        for job_id in wanted:
            if job_id in arrays:
                found.extend(members[job_id])
            elif job_id in spooled_arrays:
                found.extend(spooled_arrays[job_id])
        found.extend(self._records(plain) if plain else [])
        return found

    def records(self, *, active_only: bool = False, limit: int | None = None) -> list[JobRecord]:
        # The spool first: the daemon records a request before deleting it, so one that is gone from the
        # spool by now is in the table when we read it next. Table first, a job ingested in between is in neither.
        spooled = self._spooled()
        table = self.table()
        try:
            records = {r.id: r for r in table.records(active_only=active_only, limit=limit)}
            _add_costs(table, records, None if limit is None and not active_only else list(records))
        finally:
            table.close()
        for record in spooled:
            records.setdefault(record.id, record)
        return [records[i] for i in sorted(records)]

    def lines(self) -> list[Line]:
        """Every job as a listing's line, in id order: what ``gpuq status --all`` prints, without building
        a record per job. The spool first, as in ``records``."""
        spooled = self._spooled()
        table = self.table()
        try:
            lines = table.lines()
        finally:
            table.close()
        have = {line.id for line in lines} if spooled else set()
        extra = [Line.of(r) for r in spooled if r.id not in have]
        return sorted([*lines, *extra], key=lambda line: line.id) if extra else lines

    def array_names(self) -> dict[int, str]:
        table = self.table()
        try:
            return {array_id: info.name for array_id, info in table.arrays().items()}
        finally:
            table.close()

    def rejected(self) -> int:
        """How many spool files the daemon set aside as unreadable."""
        try:
            return sum(1 for entry in os.scandir(self.state.rejected) if entry.name.endswith(".why"))
        except OSError:
            return 0

    def inventory(self) -> Inventory | None:
        """The GPUs the daemon last saw (from ``gpus.json``), or None if it has never run here."""
        return Inventory.read(self.state.inventory)

    def _records(self, job_ids: list[int]) -> list[JobRecord]:
        if not self.state.exists():
            if not self.state.root.exists():
                raise UnknownJob(job_ids[0]) if job_ids else BadInput("no job ids given")
            raise StateDirError(f"{self.state.root} is not a gpuq state directory; check GPUQ_HOME")
        _check_ids(job_ids)
        table = self.table()
        try:
            found = {i: r for i in job_ids if (r := table.get(i)) is not None}
            _add_costs(table, found, list(found))
            missing = [i for i in job_ids if i not in found]
            if missing:
                spooled = {r.id: r for r in self._spooled()}
                for job_id in missing:
                    # The table again (ingested meanwhile?), and our own request by name when the spool
                    # cannot be listed (a shared queue's).
                    record = spooled.get(job_id) or table.get(job_id) or self._own_request(job_id)
                    if record is None:
                        raise UnknownJob(job_id)
                    found[job_id] = record
        finally:
            table.close()
        return [found[i] for i in job_ids]

    def _own_request(self, job_id: int) -> JobRecord | None:
        request = spool.read_request(self.state.submit_request(job_id))
        return expand(self.state, request)[0] if isinstance(request, spool.SubmitRequest) else None

    def _spooled(self) -> list[JobRecord]:
        if not self.state.spool.is_dir() or not os.access(self.state.spool, os.R_OK):
            return []  # a shared queue's spool is not listable: only the daemon sees others' requests
        return [record for request in spool.pending_submits(self.state) for record in expand(self.state, request)]


def _check_ids(job_ids: Iterable[int]) -> None:
    """Ids no job can have (beyond the table's integers) are unknown, not an overflow deep in SQLite."""
    for job_id in job_ids:
        if not 0 < job_id <= spool.MAX_ID:
            raise UnknownJob(job_id)


def _add_costs(table: JobTable, records: dict[int, JobRecord], job_ids: list[int] | None) -> None:
    """Give ``records`` (id -> record) what their jobs cost: GPU energy charged so far, and for ended jobs
    the host CPU time and peak memory their cgroup accounted (a running job's row, if any, is an earlier
    attempt's: ``views.live.with_host_usage`` reads its cgroup instead)."""
    for job_id, joules in table.energy(job_ids).items():
        if job_id in records:
            records[job_id] = records[job_id].replace(energy=joules)
    for job_id, (cpu_seconds, peak_ram) in table.host_usage(job_ids).items():
        record = records.get(job_id)
        if record is not None and record.state.finished and record.cluster is None:
            records[job_id] = record.replace(cpu_seconds=cpu_seconds, peak_ram=peak_ram)


def expand(state: StateDir, request: spool.SubmitRequest) -> list[JobRecord]:
    """The job records a submit request stands for: one job, or every member of an array."""
    user = accounts.user_name(request.uid)
    if request.array is None:
        return [
            JobRecord(
                id=request.job_id,
                spec=request.spec,
                uid=request.uid,
                user=user,
                state=JobState.PENDING,
                submitted_at=request.submitted_at,
                log=str(state.log(request.job_id)),
            )
        ]
    return [
        JobRecord(
            id=member_id,
            spec=request.spec.member(index),
            uid=request.uid,
            user=user,
            state=JobState.PENDING,
            submitted_at=request.submitted_at,
            log=str(state.log(member_id)),
            array_id=request.job_id,
            array_index=index,
        )
        for member_id, index in zip(request.array.member_ids(request.job_id), request.array.indices, strict=True)
    ]

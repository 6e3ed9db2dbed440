"""The job table's writes of a job's life (daemon only): new jobs recorded as pending, their starts, steps
(suspend, resume), endings and requeues, and what changes of a pending job (reasons, holds, its spec).

Only ingesting new jobs is fsynced per commit (``synchronous=FULL``; ``table`` says why the rest is not).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from gpuq_scheduler.jobs.model import ArrayInfo, JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome, Step, in_host_memory
from gpuq_scheduler.jobs.store import rows as job_rows
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.job_reads import JobReads

# A state as SQL writes it, from the enum (``schema.states`` makes the conditions).
_PENDING, _RUNNING, _SUSPENDED = (schema.literal(s) for s in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED))
_AGAIN = schema.states(JobState.RUNNING, JobState.FAILED, JobState.TIMEOUT, JobState.LOST)  # what a requeue takes


class JobWrites(JobReads):
    """How a job's record changes as it lives; each write is a transaction of its own or joins ``batch()``'s.
    A write reads first where it must (new jobs: which ids are already recorded), hence over the reads."""

    def insert_pending(
        self,
        records: Sequence[JobRecord],
        arrays: Sequence[ArrayInfo] = (),
        *,
        durable: bool = True,
        intake: Sequence[tuple[str, int, int, float]] = (),
    ) -> list[int]:
        """Record new jobs (and arrays) as pending in one transaction; ids already present are skipped.

        Array members keep no environment of their own: they share their array's, stored once.
        ``durable=False``: the caller keeps the requests until ``sync`` (the daemon: after this tick's launches).
        ``intake``: (token, uid, id, now) of the shared queue's requests these jobs came from (``intake_ids``).
        """
        if not durable:
            return self._insert(records, arrays, intake)
        self._db.execute("PRAGMA synchronous=FULL")  # the spool files go next: this must be on disk
        try:
            return self._insert(records, arrays, intake)
        finally:
            self._db.execute("PRAGMA synchronous=NORMAL")

    def _insert(
        self,
        records: Sequence[JobRecord],
        arrays: Sequence[ArrayInfo],
        intake: Sequence[tuple[str, int, int, float]],
    ) -> list[int]:
        with self.batch():
            self._db.executemany(
                "INSERT OR IGNORE INTO intake (digest, uid, id, at) VALUES (?, ?, ?, ?)",
                [(schema.token_digest(token), uid, job_id, at) for token, uid, job_id, at in intake],
            )
            known = set(self.owners({r.id for r in records})) if records else set()
            fresh = [r for r in records if r.id not in known]
            known_arrays = {row[0] for row in self._db.execute("SELECT id FROM arrays")} if arrays else set()
            self._db.executemany(
                "INSERT INTO arrays (id, uid, user, name, size, throttle, env, notify, submitted_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        a.id,
                        a.uid,
                        a.user,
                        a.name,
                        a.size,
                        a.throttle,
                        "{}" if self.private else json.dumps(dict(a.env)),
                        None if self.private else a.notify,
                        a.submitted_at,
                    )
                    for a in arrays
                    if a.id not in known_arrays
                ],
            )
            spec_columns, spec_values = job_rows.SPEC_COLUMNS, job_rows.SPEC_VALUES
            self._db.executemany(
                f"INSERT INTO jobs (id, state, uid, user, priority, env, submitted_at, log, array_id, array_index,"
                f" held, {spec_columns}) VALUES (?, {_PENDING}, ?, ?, ?, ?, ?, ?, ?, ?, ?, {spec_values})",
                [
                    (
                        r.id,
                        r.uid,
                        r.user,
                        r.spec.priority,
                        "" if r.array_id is not None or self.private else json.dumps(dict(r.spec.env)),
                        r.submitted_at,
                        r.log,
                        r.array_id,
                        r.array_index,
                        int(r.held),
                        *self._spec_row(r.spec),
                    )
                    for r in fresh
                ],
            )
        return [r.id for r in fresh]

    def mark_running(
        self, job_id: int, gpus: Sequence[int], uuids: Sequence[str], started_at: float, launch: Launch
    ) -> None:
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_RUNNING}, reason='', gpus=?, gpu_uuids=?, started_at=?, shim_pid=?,"
                f" shim_start=?, boot_id=?, port=? WHERE id=? AND {schema.states(JobState.PENDING)}",
                (
                    json.dumps(list(gpus)),
                    json.dumps(list(uuids)),
                    started_at,
                    launch.shim_pid,
                    launch.shim_start,
                    launch.boot_id,
                    launch.port,
                    job_id,
                ),
            )

    def finish(self, job_id: int, outcome: Outcome, ended_at: float) -> bool:
        """Record how an active job ended. False if it had already ended (a second report is ignored)."""
        with self.batch():
            cursor = self._db.execute(
                "UPDATE jobs SET state=?, exit_code=?, signal=?, reason=?, ended_at=?, cause=?, culprit=?,"
                f" step=NULL WHERE id=? AND {schema.LIVE_STATES}",
                (
                    outcome.state.value,
                    outcome.exit_code,
                    outcome.signal,
                    outcome.recorded_reason(),
                    ended_at,
                    outcome.cause.value,
                    outcome.culprit,
                    job_id,
                ),
            )
        return cursor.rowcount == 1

    def finish_many(self, endings: Sequence[tuple[int, Outcome, float]]) -> None:
        """Record many endings in one transaction (cancelling a 10,000-member array is one fsync)."""
        with self.batch():
            self._db.executemany(
                "UPDATE jobs SET state=?, exit_code=?, signal=?, reason=?, ended_at=?, cause=?, culprit=?,"
                f" step=NULL WHERE id=? AND {schema.LIVE_STATES}",
                [
                    (o.state.value, o.exit_code, o.signal, o.reason, t, o.cause.value, o.culprit, job_id)
                    for job_id, o, t in endings
                ],
            )

    def mark_step(self, job_id: int, step: Step) -> bool:
        """Record a suspend or resume as begun, before its first act (False: the job is not in the state the
        step starts from, or another step is in progress)."""
        source = (JobState.RUNNING if step is Step.SUSPENDING else JobState.SUSPENDED).value
        with self.batch():
            cursor = self._db.execute(
                "UPDATE jobs SET step=? WHERE id=? AND state=? AND step IS NULL", (step.value, job_id, source)
            )
        return cursor.rowcount == 1

    def undo_step(self, job_id: int) -> None:
        """The step in progress was undone: the job stands where it stood before it."""
        with self.batch():
            self._db.execute("UPDATE jobs SET step=NULL WHERE id=?", (job_id,))

    def mark_suspended(self, job_id: int, host_bytes: int, at: float) -> None:
        """The suspend finished: its GPUs are back in the pool, its state in ``host_bytes`` of host memory."""
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_SUSPENDED}, step=NULL, host_bytes=?, suspended_at=?, reason=?"
                f" WHERE id=? AND {schema.states(JobState.RUNNING)}",
                (host_bytes, at, in_host_memory(host_bytes), job_id),
            )

    def mark_resumed(self, job_id: int, at: float) -> None:
        """The resume finished: running on its GPUs again, the time it spent suspended counted."""
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_RUNNING}, step=NULL, host_bytes=NULL, reason='',"
                " suspended_for=COALESCE(suspended_for, 0) + MAX(0, ? - COALESCE(suspended_at, ?)),"
                f" suspended_at=NULL WHERE id=? AND {schema.states(JobState.SUSPENDED)}",
                (at, at, job_id),
            )

    def requeue(
        self,
        job_id: int,
        reason: str,
        *,
        attempt: int | None = None,
        not_before: float | None = None,
        outcome: Outcome | None = None,
    ) -> None:
        """Put a job back in the queue: a launch interrupted before its go, a retry (a new attempt), or a
        victim of another job's memory (``outcome``: the run's, whose cause and culprit it keeps to show)."""
        cause, culprit = (None, None) if outcome is None else (outcome.cause.value, outcome.culprit)
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET state={_PENDING}, gpus='[]', gpu_uuids='[]', started_at=NULL, ended_at=NULL,"
                " exit_code=NULL, signal=NULL, shim_pid=NULL, shim_start=NULL, boot_id=NULL, port=NULL,"
                " cancel_by=NULL, reason=?, attempt=COALESCE(?, attempt), not_before=?, cause=?, culprit=?"
                f" WHERE id=? AND {_AGAIN}",
                (reason, attempt, not_before, cause, culprit, job_id),
            )

    def set_reasons(self, reasons: dict[int, str], state: JobState = JobState.PENDING) -> None:
        """Record why pending jobs wait (or, of running ones, how long an interactive job was idle)."""
        with self.batch():
            self._db.executemany(
                "UPDATE jobs SET reason=? WHERE id=? AND state=?", [(r, i, state.value) for i, r in reasons.items()]
            )

    def set_cancel_by(self, job_id: int, who: str) -> None:
        with self.batch():
            running = schema.states(JobState.RUNNING)
            self._db.execute(f"UPDATE jobs SET cancel_by=? WHERE id=? AND {running}", (who, job_id))

    def set_peak_mem(self, peaks: dict[int, int]) -> None:
        with self.batch():
            self._db.executemany(
                "UPDATE jobs SET peak_mem=MAX(COALESCE(peak_mem, 0), ?) WHERE id=?",
                [(peak, job_id) for job_id, peak in peaks.items()],
            )

    def set_notified(self, array_id: int) -> None:
        with self.batch():
            self._db.execute("UPDATE arrays SET notified=1 WHERE id=?", (array_id,))

    def set_held(self, job_ids: Iterable[int], held: bool, reason: str = "") -> None:
        with self.batch():
            self._db.executemany(
                f"UPDATE jobs SET held=?, reason=? WHERE id=? AND {schema.states(JobState.PENDING)}",
                [(int(held), reason, job_id) for job_id in job_ids],
            )

    def update_spec(self, job_id: int, spec: JobSpec) -> None:
        """A pending job's new priority or time limit, or a retry's new memory (callers check the state)."""
        with self.batch():
            self._db.execute(
                f"UPDATE jobs SET ({job_rows.SPEC_COLUMNS}) = ({job_rows.SPEC_VALUES}), priority=? WHERE id=?",
                (*self._spec_row(spec), spec.priority, job_id),
            )

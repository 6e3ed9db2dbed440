"""Blanks: the start of the job a queue expects next, made before that job is submitted.

A job that starts on an idle GPU cannot be made ahead as a staged one is (``launcher.supervisor.ahead``): its
cgroup is named by its id, and cgroup v2 refuses to rename a cgroup. But the id is known before the submit:
a personal queue's clients take it from ``next_id``, a shared queue's daemon gives it. So while nothing waits,
the daemon makes that job's cgroup and an idle shim holds a *blank* for that id there:

* where jobs are cloned (the C library cannot spawn into a cgroup, glibc before 2.39; or a shared queue, whose
  jobs run as their users), a waiter (``launcher.supervisor.waiter``) cloned into the cgroup, whose details
  come with its go: the next job then only execs, as a hand-off does;
* elsewhere, the C library's spawn into the cgroup, built (``spawncg.Prepared``): the next job then pays
  neither the cgroup's mkdir nor the spawn's set-up, only ``posix_spawn``. A waiter's exec would cost more
  than the C library's vfork there.

A guess that misses (an array took the id, a job waits instead) costs the blank: it is ended and its cgroup
removed, never while the job it was made for is in a shim's hands (that shim makes the cgroup afresh, ending
a waiter; a spawn built for the cgroup gone is not used).
"""

from __future__ import annotations

from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.supervisor import containment, spawncg, switches


def expected(scheduler: SchedulerState) -> int | None:
    """The id the next submit gets, where jobs have cgroups and none waits."""
    if scheduler.containment.kind != containment.CGROUP or scheduler.pending or switches.off("blanks"):
        return None
    if scheduler.shared is not None:
        return scheduler.next_id
    try:
        raw = scheduler.state.next_id.read_bytes().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


def spawned(scheduler: SchedulerState) -> bool:
    """Whether a blank here is the C library's spawn built, rather than a waiter: jobs run as the daemon's
    user (a personal queue) and the C library spawns into a cgroup."""
    return scheduler.shared is None and spawncg.usable()


def wanted(scheduler: SchedulerState) -> bool:
    """Whether the blank is not the one the queue wants or not where it should be, or cgroups of blanks let go
    are left to remove."""
    return scheduler.shims.untidy or _stale(scheduler, expected(scheduler))


def _stale(scheduler: SchedulerState, job_id: int | None) -> bool:
    return job_id != scheduler.shims.blank_for or scheduler.shims.blank_misplaced


def keep(scheduler: SchedulerState) -> None:
    """Hold a blank for the job expected next (or none), and remove those let go. Called as spares are
    forked: once nothing happened for a moment, not while jobs just started want the CPU."""
    job_id = expected(scheduler)
    if _stale(scheduler, job_id):
        if job_id is None:
            scheduler.shims.unblank()
        else:
            # A personal queue's job log is opened ahead too; a shared queue's belongs to a user not known yet.
            log = scheduler.state.log(job_id) if scheduler.shared is None else ""
            scheduler.shims.blank(job_id, scheduler.containment.box(job_id), spawned(scheduler), log)
    scheduler.shims.tidy(sent(scheduler))


def sent(scheduler: SchedulerState) -> set[int]:
    """The jobs in a shim's hands: running, suspended, or staged behind a running one."""
    return set(scheduler.running) | set(scheduler.suspended) | set(scheduler.staged)

"""Blanks: the first process of the job a queue expects next, born before that job is submitted.

A job that starts on an idle GPU cannot be born ahead as a staged one is (``launcher.supervisor.ahead``): its
cgroup is named by its id, and cgroup v2 refuses to rename a cgroup. But the id is known before the submit:
a personal queue's clients take it from ``next_id``, a shared queue's daemon gives it. So while nothing waits,
an idle shim holds a *blank* for that id: a waiter (``launcher.supervisor.waiter``) cloned into the job's
cgroup, made by the daemon, whose details come with its go. The next job then only execs, as a hand-off does.

Only where jobs are cloned (the C library cannot spawn into a cgroup: glibc before 2.39; or a shared queue,
whose jobs run as their users); elsewhere a vfork at the start is cheaper than a waiter's exec. A guess that
misses (an array took the id, a job waits instead) costs the blank: it is ended and its cgroup removed, never
while the job it was born for is in a shim's hands (that shim makes the cgroup afresh, ending the blank).
"""

from __future__ import annotations

from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.supervisor import containment, spawncg


def expected(scheduler: SchedulerState) -> int | None:
    """The id the next submit gets, if a blank for it would pay: jobs are cloned here and none waits."""
    if scheduler.containment.kind != containment.CGROUP or scheduler.pending:
        return None
    if scheduler.shared is not None:
        return scheduler.next_id
    if spawncg.usable():
        return None
    try:
        raw = scheduler.state.next_id.read_bytes().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


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
            scheduler.shims.blank(job_id, scheduler.containment.box(job_id))
    scheduler.shims.tidy(sent(scheduler))


def sent(scheduler: SchedulerState) -> set[int]:
    """The jobs in a shim's hands: running, suspended, or staged behind a running one."""
    return set(scheduler.running) | set(scheduler.suspended) | set(scheduler.staged)

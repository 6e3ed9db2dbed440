"""What the daemon knows between ticks: the job table, each live job's life (``launcher.daemon.lives``), the
shims, the GPUs it last saw; and the few acts every step shares (forget an ended job, stop a running one,
charge fair share).

The steps (``intake``, ``requests``, ``endings``, ``watching``) take this state, and ``scheduler`` runs
them in order over it; so the steps never import the scheduler, and the scheduler imports the steps.

What placement reads marks the state's ``changes`` whenever it changes (``launcher.daemon.tracked``), so no
step has to say so; what one step keeps to itself is grouped by that step (``launcher.daemon.owned``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.config import Shared
from gpuq_scheduler.jobs.model import ArrayInfo, JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store import calendar, outbox, spool
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.events import Event
from gpuq_scheduler.jobs.store.private import PrivateSpecs
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.jobs.submission import Inventory, inventory_json
from gpuq_scheduler.launcher.daemon import shims
from gpuq_scheduler.launcher.daemon.controls import Controls
from gpuq_scheduler.launcher.daemon.lives import Acting, Lives, Running, Staged
from gpuq_scheduler.launcher.daemon.owned import Booked, MemAuto, Monitor, Preemption, Suspensions
from gpuq_scheduler.launcher.daemon.tracked import Changes, DictField, SetField
from gpuq_scheduler.launcher.gpus.mps import Fence, Key, Mps
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot, GpuSource
from gpuq_scheduler.launcher.policy import hostlimits, memory
from gpuq_scheduler.launcher.policy.fairshare import Usage
from gpuq_scheduler.launcher.policy.placement import Policy, Request
from gpuq_scheduler.launcher.supervisor import containment, processes, shim


class SchedulerState:
    # What placement reads, each marking ``changes`` when it changes (``launcher.daemon.tracked``), with the
    # learned memory and the probes (``launcher.daemon.owned``), the lives' moves and the takings (``lives``):
    # placement skips a pass only when none of them, the GPUs, the pause or the running jobs' records moved.
    arrays = DictField[int, ArrayInfo]()
    drained = SetField[int]()
    fence_waits = DictField[int, tuple[tuple[int, ...], tuple[str, ...]]]()
    # The fail-fast guard's word on active arrays (``endings.judge_arrays``): why an array's pending members
    # wait for it, and until when at the latest; the arrays it has decided (their members may be handed off).
    guard_waits = DictField[int, tuple[str, float]]()
    guard_open = SetField[int]()

    def __init__(
        self,
        state: StateDir,
        source: GpuSource,
        policy: Policy | None = None,
        grace: float = 10.0,
        retry_backoff: float = 10.0,
        shared: Shared | None = None,
        mps: Mps | None = None,
        fence: str | None = None,
    ) -> None:
        """``shared``: this daemon serves a whole machine (as root): jobs run as their submitters, specs
        are kept private, and the per-user limits, priorities and fair share of the config apply."""
        self.changes = Changes()
        self.state = state
        self.shared = shared
        self.admins = shared.admins if shared else None
        self.max_queued = shared.max_queued_per_user if shared else None
        self.private = PrivateSpecs(state, accounts.group_id(self.admins)) if shared else None
        self.usage: Usage | None = None  # each user's recent GPU use (a shared queue's fair share)
        self.source = source
        self.policy = policy or Policy()
        self.grace = grace
        self.retry_backoff = retry_backoff
        self.boot_id = processes.boot_id()
        self.table = JobTable(state.db, create=True, private=self.private)
        if shared is not None:
            now, half_life = time.time(), shared.fair_share_half_life
            self.usage = Usage.from_history(self.table.runs_since(now - 10 * half_life), now, half_life)
        # Each live job's life (``launcher.daemon.lives``): pending, staged, running, or suspended to host
        # memory (alive, its GPUs free for others).
        self.lives = Lives(self.changes)
        self.load_lives()
        # What each step keeps to itself (``launcher.daemon.owned``).
        self.suspensions = Suspensions()
        self.preemption = Preemption()
        self.booked = Booked(calendar.read(state))  # reservations (``daemon.reserving``)
        self.monitor = Monitor(
            idle_limit=shared.idle_limit if shared else None, idle_report=shared.idle_report if shared else None
        )
        learned = {
            kind: memory.Peak(size, job_id, raised=raised)
            for kind, (size, job_id, raised) in self.table.learned().items()
        }
        self.mem_auto = MemAuto(self.changes, learned)
        self.plan_order: list[Request] = []  # the last plan's ready jobs in queue order (both kinds of queue)
        # Arrays with a member pending or running, no others (ingest adds new ones; endings forget those whose
        # members have all ended): what the daemon holds is bounded by its queue, not by its lifetime.
        self.arrays = self.table.arrays(active_only=True)
        self.guard_waits, self.guard_open = {}, set()  # judged by the scheduler once it is built
        settings = self.table.settings()
        self.drained = set(settings.get("drained", []))
        self.paused_by: str | None = settings.get("paused_by")
        self.after_commit: list[Callable[[], None]] = []  # run once this tick's transaction is on disk
        self.on_rollback: list[Callable[[], None]] = []  # run if it is not
        # This tick's events for events.jsonl, written once what they record is committed (and the launches
        # are sent): one append per tick, off the path from a job's end to the next one's start.
        self.journal: list[Event] = []
        self.ingested: list[spool.Request] = []  # in the table, to be removed from the spool once synced
        self.touched_arrays: dict[int, bool] = {}  # arrays a member of which ended this tick -> one failed
        # The next id to give: a shared queue's daemon gives them (launcher.daemon.intake), a personal queue's
        # clients take them from next_id, which must stay above every id the table holds.
        self.next_id = max(self.table.max_id(), *(a.id + a.size for a in self.arrays.values()), 0) + 1
        if shared is None:
            outbox.raise_counter(state, self.next_id)
        self.answers_pruned = float("-inf")  # monotonic time answers/ was last pruned (intake._prune_answers)
        self.spool_left = False  # the last pass left requests in the spool for the next (isolation.ingest)
        self.last_snapshot: list[GpuSnapshot] = []
        self._inventory_key: object = None
        self._next_liveness = 0.0
        # Before any shim is forked: a daemon that must leave its own cgroup (containment's "no internal
        # processes") does so here, and its shims are born where it went.
        self.containment = containment.open_for(state.root, os.environ)
        self.containment.sweep(set(self.running) | set(self.suspended))
        self.shims = shims.Shims()
        # The fence (daemon/fences.py): for packed jobs, mps, cooperative or none. With MPS, its control
        # daemons (daemon/controls.py), the packed jobs each serves, the jobs placed that wait for theirs
        # (job -> its GPUs and their uuids), and those that take the cooperative fence since theirs failed.
        self.fence = Fence(fence or ("mps" if mps is not None else "cooperative"))
        self.controls = (
            Controls(mps, on_settled=self.changes.mark) if mps is not None and self.fence is Fence.MPS else None
        )
        self.mps_jobs: dict[Key, set[int]] = {}
        self.fence_waits = {}
        self.fence_fallback: set[int] = set()

    def load_lives(self) -> None:
        """The live jobs as the table has them."""
        running = [Running(r, launch) for r, launch in self.table.running()]
        suspended = [Running(r, launch) for r, launch in self.table.running(JobState.SUSPENDED)]
        self.lives.load(self.table.pending(), running, suspended, self.table.not_before())

    # The lives' indexes, which the steps read; only the lives' moves change them.
    @property
    def pending(self) -> Mapping[int, JobRecord]:
        """The jobs waiting for GPUs, those staged behind a running job among them."""
        return self.lives.pending

    @property
    def running(self) -> Mapping[int, Running]:
        """The jobs on their GPUs (a suspend or a resume under way among them: they hold their GPUs)."""
        return self.lives.running

    @property
    def suspended(self) -> Mapping[int, Running]:
        return self.lives.suspended

    @property
    def acting(self) -> Mapping[int, Acting]:
        """The suspends and resumes under way (``daemon.suspension.suspending``): their jobs hold their GPUs."""
        return self.lives.acting

    @property
    def not_before(self) -> Mapping[int, float]:
        """The pending jobs in a backoff, each with when it may start (on its pending life)."""
        return self.lives.not_before

    @property
    def stopped_for(self) -> Mapping[int, Outcome]:
        """The jobs gpuq is stopping (ending), each with the outcome it gets unless it succeeds first: its GPU
        was lost (``watching.sight``), the watchdog stopped it, a requeued victim's grace ran out."""
        return self.lives.stopped_for

    @property
    def staged(self) -> Mapping[int, Staged]:
        """The pending jobs handed to the shim of a running one, to start when it ends (daemon/handoff.py)."""
        return self.lives.staged

    def close(self) -> None:
        self.shims.close()
        self.containment.close(set(self.running) | set(self.suspended))
        self.table.close(rollback_mode=True)
        self.source.close()

    @property
    def idle(self) -> bool:
        return not self.pending and not self.running

    def snapshot(self) -> list[GpuSnapshot]:
        snapshot = self.source.snapshot()
        self.last_snapshot = snapshot
        fence = self.fence.value
        key = [(g.index, g.uuid, g.name, g.total, g.lost, fence) for g in snapshot]
        if key != self._inventory_key:
            self._inventory_key = key
            body = [
                {"index": g.index, "uuid": g.uuid, "name": g.name, "total": g.total, "lost": g.lost, "fence": fence}
                for g in snapshot
            ]
            # Readable by all: clients check --gpus against it (the directory decides who "all" is).
            # The containment rides along: `gpuq gpus` and doctor show it, and a submit's --cpus/--ram check it.
            text = inventory_json(body, {"containment": self.containment.to_json()})
            write_atomic(self.state.inventory, text, durable=False, mode=0o644)
        return snapshot

    def inventory(self) -> Inventory | None:
        if not self.last_snapshot:
            self.snapshot()
        return Inventory(tuple(g.total for g in self.last_snapshot))

    def charge(self, record: JobRecord, ended: float) -> None:
        """Count a run that just ended toward its user's recent GPU use (fair share)."""
        if self.usage is not None and record.gpus and record.started_at is not None:
            self.usage = self.usage.charge(record.user, len(record.gpus), record.started_at, ended, ended)

    def shim_launch(
        self,
        record: JobRecord,
        gpus: tuple[int, ...],
        env: dict[str, str],
        port: int | None = None,
        account: accounts.Account | None = None,
    ) -> shim.Launch:
        """What a shim needs to run ``record`` on ``gpus`` with ``env`` (given the job's marker here)."""
        box = self.containment.box(record.id, *self.host_limits(record.spec))
        env[containment.MARKER] = box.marker
        return shim.Launch(
            job_id=record.id,
            argv=processes.job_argv(record.spec, port),
            env=env,
            cwd=record.spec.cwd,
            log=self.state.log(record.id),
            exit_file=self.state.exit_file(record.id),
            pid_file=self.state.pid_file(record.id),
            wake=self.state.inner_wake,
            time_limit=record.spec.time_limit,
            grace=self.grace,
            account=account,
            log_group=self.private.admin_gid if self.private else None,
            box=box,
            pause_file=self.state.pause_file(record.id),
            output=record.output_file,
        )

    def host_limits(self, spec: JobSpec) -> tuple[float | None, int | None, int | None]:
        """The job's --cpus, --ram and --pids, else a shared queue's defaults, where the controllers enforce them."""
        shared = self.shared
        defaults = hostlimits.NONE
        if shared is not None:
            defaults = hostlimits.HostLimits(shared.default_cpus, shared.default_ram, shared.default_pids)
        chosen = hostlimits.for_job(spec, defaults, self.containment.controllers)
        return chosen.cpus, chosen.ram, chosen.pids

    def unenforceable(self, spec: JobSpec) -> str:
        """Why the job's own --cpus, --ram or --pids cannot be enforced now ("" if it can): the controllers were
        there when it was submitted, and are not since this daemon started."""
        why = self.containment.limits_why or self.containment.describe()
        return hostlimits.unenforceable(spec, self.containment.controllers, why)

    def stop(self, job: Running) -> None:
        """Ask a running job's shim to stop it (SIGTERM to the job's group, SIGKILL after the grace period)."""
        if not self.shims.cancel(job.record.id):  # started by an earlier daemon: we have no pipe to its shim
            processes.signal_shim(job.launch.shim_pid, job.launch.shim_start)

    def stop_for(self, job: Running, outcome: Outcome) -> None:
        """Stop a running job now, to end as ``outcome`` unless it succeeds first."""
        self.lives.stop(job.record.id, outcome)
        self.stop(job)

    def cancel(self, job: Running, who: str) -> None:
        """Stop a running job so that it ends as cancelled by ``who`` (a user, or gpuq's idle limit)."""
        self.table.set_cancel_by(job.record.id, who)
        job.launch = dataclasses.replace(job.launch, cancel_by=who)
        self.stop(job)

    def forget(self, job_id: int) -> None:
        """Drop an ended job from the in-memory view of the queue: its life and marks, in one removal; the probe
        of its kind, if it was one; its shim, if that died with it."""
        self.lives.end(job_id)
        for kind in [kind for kind, prober in self.mem_auto.probes.items() if prober == job_id]:
            del self.mem_auto.probes[kind]  # a probe that ended (or never ran): the next of its kind probes
        self.shims.lost(job_id)  # still there only if it ended without an exit file: its shim died

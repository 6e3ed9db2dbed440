"""A job's launch: from the queue onto its shim, on the GPUs placement (or a fence, or a preemption) gave it.

Its checks (its owner's account, a private spec, its host limits), its environment (the fence's share, the fast
suspend's handler), and its shim's go, sent only once the job is recorded running (``after_commit``). A job that
cannot start is given back with its outcome, for the scheduler to end (``endings.finish``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.config import Shared
from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.events import Event, Started
from gpuq_scheduler.jobs.store.private import is_public
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.daemon import endings, fences, learning
from gpuq_scheduler.launcher.daemon.lives import Lives, Running
from gpuq_scheduler.launcher.daemon.shims import Shims
from gpuq_scheduler.launcher.daemon.suspension import fastpath
from gpuq_scheduler.launcher.gpus.snapshot import GpuSnapshot
from gpuq_scheduler.launcher.policy.placement import Policy
from gpuq_scheduler.launcher.supervisor import processes, shim

log = logging.getLogger("gpuq.scheduler")


class Launching(fences.Fencing, Protocol):
    """What a launch asks of the state, besides the fences' own (``fences.Fencing``): the directory, whether the
    queue is shared, the lives, the table, the pass's journal and what undoes it, the shims and what each is
    sent (``shim_launch``), this boot, placement's policy and the GPUs as last seen (a fence's share), and
    whether a job's host limits can be enforced."""

    @property
    def state(self) -> StateDir: ...

    @property
    def shared(self) -> Shared | None: ...

    @property
    def lives(self) -> Lives: ...

    @property
    def table(self) -> JobTable: ...

    @property
    def journal(self) -> list[Event]: ...

    @property
    def on_rollback(self) -> list[Callable[[], None]]: ...

    @property
    def shims(self) -> Shims: ...

    @property
    def boot_id(self) -> str: ...

    @property
    def policy(self) -> Policy: ...

    @property
    def last_snapshot(self) -> list[GpuSnapshot]: ...

    def shim_launch(
        self,
        record: JobRecord,
        gpus: tuple[int, ...],
        env: dict[str, str],
        port: int | None = None,
        account: accounts.Account | None = None,
    ) -> shim.Launch: ...

    def unenforceable(self, spec: JobSpec) -> str: ...


def launch(
    state: Launching, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...], now: float
) -> Outcome | None:
    """Start the pending ``record`` on ``gpus`` (or leave it waiting for its MPS fence); or the outcome it ends
    with, failed to spawn, saying why it cannot start."""
    spec = record.spec
    account = None
    if state.shared is not None:
        account = accounts.account(record.uid)
        problem = "" if account else f"its owner (uid {record.uid}) no longer has an account here"
        if is_public(spec):
            where = state.state.private_file(record.id if record.array_id is None else record.array_id)
            problem = f"its command and environment ({where}) are missing or not its owner's (see `gpuq doctor`)"
        if problem:
            return Outcome.failed_to_spawn(problem)
    problem = state.unenforceable(spec)
    if problem:
        return Outcome.failed_to_spawn(problem)
    port = None
    if spec.mode.value == "torchrun":
        port = processes.free_port({j.launch.port for j in state.lives.running.values() if j.launch.port})
    # MPS's limit, or PyTorch's, at its share
    fence = fences.environment(
        state, record, gpus, uuids, account=account, overhead=state.policy.overhead, snapshot=state.last_snapshot
    )
    if fence is None:  # its user's control daemon on that GPU is starting: it waits for it there
        fences.wait(state, record, gpus, uuids)
        return None
    env = processes.job_env(spec, record.id, gpus, uuids, state.state.root, record)
    env.update(fence)
    env.update(processes.preemption_env(spec, state.state.restarts_file(record.id)))
    if spec.preemptible and spec.mode.value != "torchrun":  # the fast suspend's handler (suspension/fastpath.py)
        try:
            env.update(fastpath.prepare(state.state.fast_dir(record.id), env, account))
        except OSError as err:  # the driver's path stays: a suspend says why the fast one was not asked
            log.warning("job %d: no fast suspend: %s", record.id, err)
    state.on_rollback.append(lambda: fences.forget(state, record.id))
    if spec.mem_auto:
        learning.launched(state.table, record)
    shim_launch = state.shim_launch(record, gpus, env, port, account)
    endings.unlink(shim_launch.exit_file, shim_launch.pid_file)  # an earlier attempt's, which would say it ended
    try:
        supervisor = state.shims.take(record.id)
    except OSError as err:
        return Outcome.failed_to_spawn(f"fork failed: {err.strerror}")
    info = Launch(supervisor.pid, supervisor.started, state.boot_id, port)
    state.on_rollback.append(lambda: state.shims.ended(record.id))  # it was sent nothing: idle again
    state.table.mark_running(record.id, gpus, uuids, now, info)
    state.after_commit.append(lambda: supervisor.start(shim_launch))  # the job starts only once recorded running
    running = record.replace(state=JobState.RUNNING, gpus=gpus, gpu_uuids=uuids, started_at=now)
    state.lives.start(Running(running, info))
    state.journal.append(Started(now, record.id, tuple(gpus)))
    return None

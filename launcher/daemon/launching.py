"""A job's launch: from the queue onto its shim, on the GPUs placement (or a fence, or a preemption) gave it.

Its checks (its owner's account, a private spec, its host limits), its environment (the fence's share, the fast
suspend's handler), and its shim's go, sent only once the job is recorded running (``after_commit``).
"""

from __future__ import annotations

import logging

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.model import JobRecord, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store.events import Started
from gpuq_scheduler.jobs.store.private import is_public
from gpuq_scheduler.launcher.daemon import endings, fences, learning
from gpuq_scheduler.launcher.daemon.lives import Running
from gpuq_scheduler.launcher.daemon.state import SchedulerState
from gpuq_scheduler.launcher.daemon.suspension import fastpath
from gpuq_scheduler.launcher.supervisor import processes

log = logging.getLogger("gpuq.scheduler")


def launch(state: SchedulerState, record: JobRecord, gpus: tuple[int, ...], uuids: tuple[str, ...], now: float) -> None:
    """Start the pending ``record`` on ``gpus``, or end it failed to spawn saying why it cannot start."""
    spec = record.spec
    account = None
    if state.shared is not None:
        account = accounts.account(record.uid)
        problem = "" if account else f"its owner (uid {record.uid}) no longer has an account here"
        if is_public(spec):
            where = state.state.private_file(record.id if record.array_id is None else record.array_id)
            problem = f"its command and environment ({where}) are missing or not its owner's (see `gpuq doctor`)"
        if problem:
            endings.finish(state, record, Outcome.failed_to_spawn(problem), now, [])
            return
    problem = state.unenforceable(spec)
    if problem:
        endings.finish(state, record, Outcome.failed_to_spawn(problem), now, [])
        return
    port = None
    if spec.mode.value == "torchrun":
        port = processes.free_port({j.launch.port for j in state.running.values() if j.launch.port})
    fence = fences.environment(state, record, gpus, uuids)  # MPS's limit, or PyTorch's, at its share
    if fence is None:  # its user's control daemon on that GPU is starting: it waits for it there
        fences.wait(state, record, gpus, uuids)
        return
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
        endings.finish(state, record, Outcome.failed_to_spawn(f"fork failed: {err.strerror}"), now, [])
        return
    info = Launch(supervisor.pid, supervisor.started, state.boot_id, port)
    state.on_rollback.append(lambda: state.shims.ended(record.id))  # it was sent nothing: idle again
    state.table.mark_running(record.id, gpus, uuids, now, info)
    state.after_commit.append(lambda: supervisor.start(shim_launch))  # the job starts only once recorded running
    running = record.replace(state=JobState.RUNNING, gpus=gpus, gpu_uuids=uuids, started_at=now)
    state.lives.start(Running(running, info))
    state.journal.append(Started(now, record.id, tuple(gpus)))

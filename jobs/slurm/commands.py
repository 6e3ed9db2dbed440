"""Talking to Slurm: run sbatch, squeue, sacct and scancel, read their parsable output, and say what
Slurm's view of a job means for its gpuq record.

The commands are thin functions (the only I/O here); parsing and ``follow`` are pure and unit-tested.
Sources of a job's fate, best first: the exit file its batch script wrote (``run/<id>.exit``, the local
shims' format, on the state directory the cluster shares); ``squeue -t all``, which still lists jobs that
ended for MinJobAge (5 minutes by default); ``sacct``, where the cluster keeps accounting.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput, GpuqError
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState, Outcome

SQUEUE_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "Reason",
    "NodeList",
    "StartTime",
    "EndTime",
    "exit_code",
    "RestartCnt",
)
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Start", "End", "NodeList")

PENDING = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT", "CONFIGURING"}
)
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"})
HELD = frozenset({"JobHeldUser", "JobHeldAdmin", "SPECIAL_EXIT"})
TIMEOUT = 120.0  # seconds for one Slurm command: a controller that slow is down, as far as a reader cares


class Unreachable(GpuqError):
    """Slurm did not answer (controller down, command missing): records stay as last seen."""


@dataclass(frozen=True)
class SlurmJob:
    """One job, or one task of an array, as squeue or sacct reports it."""

    key: str  # "1234", or "1234_5" for task 5 of array job 1234
    state: str  # Slurm's state name: PENDING, RUNNING, COMPLETED, FAILED...
    reason: str = ""
    node: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0

    @property
    def active(self) -> bool:
        return self.state in PENDING or self.state in RUNNING


# -- the commands ----------------------------------------------------------------------------------


def command(name: str) -> str:
    """The full path of a Slurm client command, or a one-line error saying where to run gpuq instead."""
    found = shutil.which(name)
    if found is None:
        raise BadInput(
            f"{name} not found: run this on a machine with Slurm's client commands (a cluster's login node), "
            "or add their directory to PATH"
        )
    return found


def sbatch(argv: Sequence[str], script: str, env: Mapping[str, str], cluster: str) -> str:
    """Submit; returns the Slurm job id. sbatch's own refusal (bad partition, account...) is one line."""
    proc = _run([command("sbatch"), *argv[1:]], env=env, stdin=script)
    if proc.returncode != 0:
        raise BadInput(f"sbatch refused the job on cluster {cluster}: {_last_error(proc.stderr)}")
    job_id = proc.stdout.strip().split(";")[0]  # --parsable prints ID or ID;CLUSTER
    if not job_id.isdigit():
        raise BadInput(f"sbatch on cluster {cluster} printed {proc.stdout.strip()[:80]!r}, not a job id")
    return job_id


def squeue(job_ids: Sequence[str]) -> dict[str, SlurmJob]:
    """What the controller knows about these jobs (array job ids stand for all their tasks), ended ones included."""
    fmt = ",".join(f"{field}:|" for field in SQUEUE_FIELDS)
    proc = _run([command("squeue"), "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-O", fmt])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {}  # one id, forgotten by the controller (a list of several just leaves them out)
        raise Unreachable(f"squeue failed: {_last_error(proc.stderr)}")
    return parse_squeue(proc.stdout)


def sacct(job_ids: Sequence[str]) -> dict[str, SlurmJob] | None:
    """What accounting knows about these jobs; None when the cluster keeps none (or sacct fails)."""
    try:
        path = command("sacct")
    except BadInput:
        return None
    proc = _run([path, "-P", "-n", "-X", "-j", ",".join(job_ids), "-o", ",".join(SACCT_FIELDS)])
    if proc.returncode != 0:
        return None  # "Slurm accounting storage is disabled", typically
    return parse_sacct(proc.stdout)


def scancel(targets: Sequence[str], cluster: str) -> None:
    """Cancel jobs, arrays (by array job id) or array tasks (ARRAYJOB_TASK)."""
    proc = _run([command("scancel"), *targets])
    if proc.returncode != 0:
        raise BadInput(f"scancel on cluster {cluster} failed: {_last_error(proc.stderr)}")


def _run(
    argv: list[str], env: Mapping[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            input=stdin,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise Unreachable(f"{argv[0]} gave no answer in {TIMEOUT:.0f}s: is the Slurm controller up?") from None
    except OSError as err:
        raise Unreachable(f"cannot run {argv[0]}: {err.strerror}") from None


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "no message"
    for prefix in ("sbatch: error: ", "squeue: error: ", "scancel: error: ", "error: "):
        last = last.removeprefix(prefix)
    return last[:300]


# -- parsing (pure) ----------------------------------------------------------------------------------


def parse_squeue(text: str) -> dict[str, SlurmJob]:
    """``squeue -h -r -O JobID:|,ArrayJobID:|,...`` lines, by job key (``1234`` or ``1234_5``)."""
    found = {}
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(SQUEUE_FIELDS):
            continue
        job, array_job, task, state, reason, node, start, end, status, restarts = cells[: len(SQUEUE_FIELDS)]
        key = f"{array_job}_{task}" if task not in ("N/A", "") else job
        code, signum = _wait_status(status)
        found[key] = SlurmJob(
            key=key,
            state=state.split()[0] if state else "UNKNOWN",
            reason="" if reason == "None" else reason,
            node=node or None,
            started_at=parse_time(start),
            ended_at=parse_time(end),
            exit_code=code,
            signal=signum,
            restarts=int(restarts) if restarts.isdigit() else 0,
        )
    return found


def parse_sacct(text: str) -> dict[str, SlurmJob]:
    """``sacct -P -n -X -o JobID,State,ExitCode,Start,End,NodeList`` lines, by job key."""
    found = {}
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(SACCT_FIELDS) or "[" in cells[0]:
            continue  # "1234_[5-9]": tasks that never started, still pending
        job, state, exit_code, start, end, node = cells[: len(SACCT_FIELDS)]
        code_text, _, signal_text = exit_code.partition(":")  # "CODE:SIGNAL"
        signum = int(signal_text) if signal_text.isdigit() and int(signal_text) else None
        found[job] = SlurmJob(
            key=job,
            state=state.split()[0] if state else "UNKNOWN",
            node=None if node in ("", "None assigned") else node,
            started_at=parse_time(start),
            ended_at=parse_time(end),
            signal=signum,
            exit_code=None if signum is not None or not code_text.isdigit() else int(code_text),
        )
    return found


def parse_time(text: str) -> float | None:
    """Slurm's local ``2026-11-22T18:20:51`` as epoch seconds; N/A, NONE, Unknown and the like as None."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _wait_status(text: str) -> tuple[int | None, int | None]:
    """squeue's exit_code is the batch script's raw wait status: (exit code, None) or (None, signal)."""
    if not text.strip().isdigit():
        return None, None
    status = int(text)
    return (None, status & 0x7F) if status & 0x7F else (status >> 8, None)


# -- what it means for the record (pure) ---------------------------------------------------------------


def follow(
    record: JobRecord,
    seen: SlurmJob | None,
    exit_data: Mapping[str, Any] | None,
    *,
    cancel_by: str | None = None,
    failed_dependency: str | None = None,
) -> JobRecord | None:
    """The record as Slurm (``seen``: squeue's or sacct's view) and the job's exit file describe it now;
    None when neither knows anything (the caller decides whether that makes the job lost).

    An exit file from an earlier attempt (the job was requeued after writing it) is ignored.
    ``failed_dependency`` names the dependency that ended badly, for a job Slurm will never start.
    """
    if exit_data is not None and not _stale(exit_data, seen):
        return _from_exit(record, exit_data, seen, cancel_by)
    if seen is None:
        return None
    attempt = max(record.attempt, seen.restarts + 1)
    if seen.state in PENDING:
        waiting = f"waiting in Slurm: {seen.reason or seen.state}"
        if seen.restarts:
            waiting = f"attempt {attempt} of {record.spec.retries + 1}, {waiting}"
        return record.replace(
            state=JobState.PENDING,
            reason=waiting,
            held=seen.reason in HELD or seen.state in HELD,
            attempt=attempt,
            started_at=None,
        )
    if seen.state in RUNNING:
        return record.replace(
            state=JobState.RUNNING,
            reason="",
            held=False,
            attempt=attempt,
            node=seen.node,
            started_at=seen.started_at or record.started_at,
        )
    outcome = slurm_outcome(record, seen, cancel_by, failed_dependency)
    ran = seen.node is not None and seen.started_at is not None and seen.reason != "DependencyNeverSatisfied"
    return record.ended(
        outcome,
        attempt=attempt,
        node=seen.node if ran else record.node,
        started_at=seen.started_at if ran else None,
        ended_at=seen.ended_at or seen.started_at or record.submitted_at,
    )


def slurm_outcome(record: JobRecord, seen: SlurmJob, cancel_by: str | None, failed_dependency: str | None) -> Outcome:
    """How a job ended, from Slurm's final state alone (no exit file)."""
    state, why = seen.state, f" (Slurm: {seen.reason})" if seen.reason else ""
    if state == "COMPLETED":
        return Outcome.succeeded()
    if state == "CANCELLED" and seen.reason == "DependencyNeverSatisfied":
        return Outcome.not_run(f"not run: {failed_dependency or 'a dependency did not succeed'}")
    if state == "CANCELLED":
        return Outcome.cancelled(cancel_by or "Slurm (scancel outside gpuq, or an admin)", seen.signal)
    if state in ("TIMEOUT", "DEADLINE"):
        return _timeout(record, seen.signal)
    if state == "OUT_OF_MEMORY":
        return Outcome.out_of_host_memory(
            "out of host memory (Slurm OUT_OF_MEMORY): ask for more with --mem in sbatch_flags",
            seen.exit_code,
            seen.signal,
        )
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return Outcome.lost(f"Slurm: {state} on node {seen.node or '?'}")
    if state == "PREEMPTED":
        return Outcome.lost("preempted by Slurm; resubmit it, or add --retries (preempted jobs are requeued then)")
    if state == "FAILED":
        if seen.signal is not None:
            return Outcome.killed(seen.signal, f"Slurm: {seen.reason}" if seen.reason else "")
        code = seen.exit_code if seen.exit_code is not None else 1
        return Outcome.failed(code, f"Slurm: {seen.reason}" if seen.reason else "")
    return Outcome.lost(f"Slurm reports state {state}{why}")


def _from_exit(record: JobRecord, data: Mapping[str, Any], seen: SlurmJob | None, cancel_by: str | None) -> JobRecord:
    code, signum = _int(data.get("exit_code")), _int(data.get("signal"))
    outcome: Outcome
    # Slurm's stop before the exit code: a job that caught the signal and exited 0 did not finish its work.
    if data.get("spawn_error"):
        outcome = Outcome.failed_to_spawn(str(data["spawn_error"]))
    elif data.get("reason") == "signal" and seen is not None and seen.state in ("TIMEOUT", "DEADLINE"):
        outcome = _timeout(record, signum)
    elif data.get("reason") == "signal" and (cancel_by or (seen is not None and seen.state == "CANCELLED")):
        outcome = Outcome.cancelled(cancel_by or "Slurm (scancel outside gpuq, or an admin)", signum)
    elif code == 0:
        outcome = Outcome.succeeded()
    elif code is not None:
        outcome = Outcome.failed(code)
    elif signum is not None:
        outcome = Outcome.killed(signum)
    else:
        outcome = Outcome.lost("its batch script reported no exit status")
    gpus = tuple(int(g) for g in str(data.get("gpus", "")).split(",") if g.strip().isdigit())
    node = data.get("node")
    return record.ended(
        outcome,
        started_at=_float(data.get("started_at")) or record.started_at,
        ended_at=_float(data.get("ended_at")),
        gpus=gpus,
        node=node if isinstance(node, str) else record.node,
        attempt=_int(data.get("attempt")) or record.attempt,
    )


def _stale(data: Mapping[str, Any], seen: SlurmJob | None) -> bool:
    """An exit file from an attempt before the one Slurm now runs or queues (a preempted, requeued job's)."""
    attempt = _int(data.get("attempt")) or 1
    return seen is not None and seen.active and attempt < seen.restarts + 1


def _timeout(record: JobRecord, signum: int | None) -> Outcome:
    if record.spec.time_limit is not None:
        return Outcome.timeout(record.spec.time_limit, signum)
    return Outcome.timeout(None, signum)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

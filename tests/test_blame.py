"""Blame where it belongs: an outcome carries a typed cause, set where the fact is known and stored in the
table; a job that ran out of GPU memory within its share, beside a job past its own, is the victim: its
reason names the culprit, it is queued again without spending a retry, and --mem auto learns nothing
from that run. The e2e test runs tests/fixtures/fake_cuda.py on the fake inventory, where a job's memory
counts against its neighbours' as on a real GPU."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from gpuq_scheduler.jobs.causes import Cause, Culprit, OutOfMemory
from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Launch
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.jobs.store import schema
from gpuq_scheduler.jobs.store.table import JobTable
from gpuq_scheduler.launcher.policy import blame, lifecycle
from gpuq_scheduler.launcher.policy.blame import Sampled
from tests.conftest import fake_cuda_queue, wait_for

GiB = 1 << 30
OVERHEAD = 1 * GiB


def _oom(job: Sampled, *others: Sampled, fenced: bool = True, free: dict[int, int] | None = None) -> OutOfMemory:
    return blame.out_of_memory(job, [0], others, overhead=OVERHEAD, fenced=fenced, asked="4.0G", free=free or {})


def test_a_packed_job_within_its_share_beside_one_past_its_own_is_the_victim() -> None:
    victim = Sampled(5, 4 * GiB, {0: 2 * GiB})
    honest, liar = Sampled(3, 4 * GiB, {0: 4 * GiB}), Sampled(4, 4 * GiB, {0: int(22.4 * GiB)})
    found = _oom(victim, honest, liar)
    assert found.cause is Cause.OOM_VICTIM and found.culprit == Culprit(4, 0, int(22.4 * GiB), 4 * GiB)
    assert found.sentence() == "CUDA out of memory: GPU 0 was full; job 4 held 22.4 GiB against its 4.0G share"
    lesser = Sampled(6, 2 * GiB, {0: 10 * GiB})  # 8 GiB past its share; the liar is 18.4 GiB past: named
    assert _oom(victim, lesser, liar).culprit == Culprit(4, 0, int(22.4 * GiB), 4 * GiB)


def test_out_of_memory_that_is_the_jobs_own_is_not_blamed_on_others() -> None:
    liar = Sampled(4, 4 * GiB, {0: 22 * GiB})
    # Past its own share: its fence stopped it, whatever its neighbours did.
    assert _oom(Sampled(5, 4 * GiB, {0: 6 * GiB}), liar).cause is Cause.OOM_PAST_SHARE
    # Nobody past a share: it asked past its fence (the usual case, the sample saw it within).
    assert _oom(Sampled(5, 4 * GiB, {0: 1 * GiB}), Sampled(3, 4 * GiB, {0: 5 * GiB})).cause is Cause.OOM_PAST_SHARE
    # No fence: plain out of memory; a whole-GPU job has no share to be within.
    assert _oom(Sampled(5, 4 * GiB, {}), fenced=False).cause is Cause.OOM
    assert _oom(Sampled(5, None, {0: 70 * GiB}), liar).cause is Cause.OOM
    # Within the context's allowance and the sample's tolerance, a neighbour is not past its share.
    near = Sampled(3, 4 * GiB, {0: 4 * GiB + OVERHEAD + blame.TOLERANCE})
    assert _oom(Sampled(5, 4 * GiB, {0: 1 * GiB}), near).cause is Cause.OOM_PAST_SHARE


def test_within_its_share_on_a_gpu_full_of_outside_use_says_so() -> None:
    found = _oom(Sampled(5, 4 * GiB, {0: 1 * GiB}), free={0: 1 * GiB})
    assert found.cause is Cause.OOM_WITHIN_SHARE
    assert found.sentence() == "CUDA out of memory within its 4.0G share: GPU 0 was full (1.0G free)"


def test_retries_and_learning_decide_by_the_cause_not_the_words() -> None:
    spec = JobSpec(command=("x",), cwd="/", mem_per_gpu=4 * GiB, oom_retry=True)
    record = JobRecord(1, spec, 0, "a", JobState.RUNNING, 0.0)
    past = Outcome.out_of_memory(OutOfMemory(Cause.OOM_PAST_SHARE, share=4 * GiB, asked="4.0G"), 1, None)
    retry = lifecycle.retry(record, past, backoff=1, biggest_gpu=80 * GiB)
    assert retry is not None and retry.spec.mem_per_gpu == 8 * GiB
    # A job whose log says the words, but whose cause is an exit code (it printed them), earns nothing.
    said = Outcome.failed(1, "CUDA out of memory at its 4.0G share (--mem 4.0G)")
    assert said.cause is Cause.EXIT_CODE and lifecycle.retry(record, said, backoff=1, biggest_gpu=None) is None
    assert Cause.OOM_VICTIM.not_its_fault and not Cause.OOM_PAST_SHARE.not_its_fault


def _as_version_2(path: Path) -> None:
    """Make a table of this version what version 2 was: no typed causes, nothing suspended."""
    db = sqlite3.connect(path, isolation_level=None)
    for column, _ in [*schema.CAUSED, *schema.SUSPENSION]:
        db.execute(f"ALTER TABLE jobs DROP COLUMN {column}")
    db.execute("PRAGMA user_version=2")
    db.close()


def test_a_version_2_table_is_read_then_given_causes_by_the_daemon(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    table = JobTable(path, create=True)
    specs = [JobSpec(command=(f"/bin/job{i}",), cwd="/", mem_per_gpu=4 * GiB) for i in range(6)]
    table.insert_pending([JobRecord(i + 1, s, 0, "root", JobState.PENDING, float(i)) for i, s in enumerate(specs)])
    endings = [
        Outcome.succeeded(),
        Outcome.failed(3),
        Outcome.out_of_memory(OutOfMemory(Cause.OOM_PAST_SHARE, share=4 * GiB, asked="4.0G"), 1, None),
        Outcome.killed(9),
        Outcome.cancelled("alice"),
    ]
    for job_id, outcome in enumerate(endings, start=1):
        table.mark_running(job_id, [0], [], 10.0, Launch(1, 1.0, "boot"))
        table.finish(job_id, outcome, 20.0)
    table.close()
    _as_version_2(path)
    reader = JobTable(path)  # `gpuq status` before the upgraded daemon has run: no causes yet, no error
    assert [r.cause for r in reader.records()] == [None] * 6
    reader.close()
    daemon = JobTable(path, create=True)
    assert [r.cause for r in daemon.records()] == [
        Cause.SUCCEEDED,
        Cause.EXIT_CODE,
        Cause.OOM_PAST_SHARE,
        Cause.SIGNAL,
        Cause.CANCELLED,
        None,
    ]
    daemon.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == schema.TABLE_VERSION


def test_a_victim_names_its_culprit_runs_again_without_spending_a_retry_and_teaches_nothing(tmp_path: Path) -> None:
    """One 24 GiB GPU: a job that drops its MPS limit grows to 20.5 GiB on its 4G share; its packed neighbour,
    growing to 4.5 GiB within its own 4G share (plus its context), finds the GPU full. The watchdog only
    warns here: stopping, it would end the culprit at its first sample past its share (tests/test_watchdog.py),
    and the victim rule is for what it cannot prevent (a spike between samples, or a watchdog set to warn)."""
    gpuq = fake_cuda_queue(
        tmp_path,
        "1x24GiB",
        GPUQ_FAKE_MPS="1",
        GPUQ_RETRY_BACKOFF="0.2",
        FAKE_CUDA_TOTAL=str(24 * GiB),
        GPUQ_WATCHDOG="warn",
    )
    try:
        go_culprit, go_victim = gpuq.cwd / "culprit.go", gpuq.cwd / "victim.go"
        culprit = gpuq.submit(
            "--mem",
            "4G",
            "env",
            "-u",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "python3",
            "fake_cuda.py",
            "1",
            "600",
            "--grow-to",
            "20",
            "--grow-when",
            str(go_culprit),
        )
        victim = gpuq.submit(
            "--name",
            "victim",
            "--mem",
            "4G",
            "--oom-retry",
            "fake_cuda.py",
            "1",
            "1",
            "--grow-to",
            "4",
            "--grow-when",
            str(go_victim),
        )
        gpuq.wait_state(culprit, "running")
        gpuq.wait_state(victim, "running")
        go_culprit.touch()
        wait_for(lambda: (gpuq.job(culprit)["peak_mem"] or 0) >= 20 * GiB, 20, "the daemon to sample the culprit")
        go_victim.touch()
        requeued = gpuq.wait_state(victim, "pending", "failed", "succeeded")
        assert requeued["state"] == "pending", requeued
        assert requeued["cause"] == "oom-victim" and requeued["culprit"] == culprit
        assert requeued["reason"].startswith(
            "queued again, not counted against its retries: CUDA out of memory: GPU 0 was full; "
            f"job {culprit} held 20.5 GiB against its 4.0G share (exit code 1)"
        )  # then "(in 0s)", the backoff's countdown
        assert requeued["attempt"] == 1 and requeued["mem_per_gpu"] == 4 * GiB  # no doubled share for a victim
        assert f"oom-victim (culprit: job {culprit})" in gpuq.run("show", str(victim)).stdout
        db = sqlite3.connect(gpuq.home / "jobs.db")
        assert db.execute("SELECT kind FROM learned WHERE kind='name:victim'").fetchall() == []
        db.close()
        # The culprit holds the GPU until ended here: "queued again" above held by construction, not because
        # it was seen within the culprit's run.
        gpuq.run("cancel", str(culprit))
        done = gpuq.wait_state(victim, "succeeded", "failed", timeout=60)  # once the culprit has ended
        assert done["state"] == "succeeded" and done["attempt"] == 1 and done["cause"] == "succeeded"
        events = [json.loads(line) for line in (gpuq.home / "events.jsonl").read_text().splitlines()]
        blamed = [e for e in events if e.get("job") == victim and e.get("cause") == "oom-victim"]
        assert blamed and blamed[0]["culprit"] == culprit
    finally:
        gpuq.cleanup()

# One module past 400 lines on purpose: its trainers' job scripts and the daemon tests that run them belong together.
"""Automatic preemption (#28, 2) with a real daemon on the fake inventory: an urgent job takes the GPU of a
preemptible counting job, which stops where it was and, once the urgent job ended, goes on to the end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Gpuq, counted, fake_cuda_queue, wait_for

COUNTER = Path(__file__).parent / "fixtures" / "fake_counter.py"


def _queue(tmp_path: Path, **extra: str) -> Gpuq:
    settings = {"GPUQ_FAKE_HOST_MEMORY": "256GiB", "GPUQ_PREEMPT": "on", "GPUQ_PREEMPT_MIN_RUNTIME": "1s", **extra}
    queue = fake_cuda_queue(tmp_path, "2x80GiB", **settings)
    shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
    return queue


def _counters(queue: Gpuq, last: int, *more: str) -> list[tuple[int, Path]]:
    """A counting job holding 60 GiB on each GPU, both seen counting and holding their memory."""
    jobs = []
    for n in range(2):
        counts = queue.cwd / f"counts{n}"
        jobs.append((queue.submit(*more, "fake_counter.py", "60", str(counts), str(last)), counts))
    for job, counts in jobs:
        seen = lambda job=job, counts=counts: len(counted(counts)) > 5 and queue.job(job)["peak_mem"]  # noqa: E731
        wait_for(seen, 30, f"job {job} to count")
    return jobs


def _untouched(queue: Gpuq, jobs: list[tuple[int, Path]], urgent: int) -> None:
    """The jobs count on, each still running (never suspended), while the urgent job waits."""
    for job, counts in jobs:
        before = len(counted(counts))
        wait_for(lambda: len(counted(counts)) > before + 20, 30, "the job to count on")  # noqa: B023
        assert queue.job(job)["state"] == "running"
    assert queue.job(urgent)["state"] == "pending"


def _events(queue: Gpuq) -> list[dict[str, Any]]:
    path = queue.home / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def preempted_bytes(events: list[dict[str, Any]], job: int) -> int:
    return sum(e["bytes"] for e in events if e.get("job") == job and e.get("event") == "suspended")


def _never_double_booked(events: list[dict[str, Any]]) -> None:
    """From the journal: at no moment do two jobs hold one GPU (a job holds its GPUs from start or resume
    until it is suspended or ends)."""
    gpus: dict[int, list[int]] = {}
    holder: dict[int, int] = {}
    for event in events:
        job, kind = event.get("job"), event.get("event")
        if kind == "started":
            gpus[job] = event["gpus"]
        if kind in ("started", "resuming"):
            for gpu in gpus[job]:
                assert holder.get(gpu) in (None, job), f"GPU {gpu} given to job {job} while job {holder[gpu]} held it"
                holder[gpu] = job
        elif kind in ("suspended", "succeeded", "failed", "cancelled", "timeout", "lost", "requeued"):
            for gpu in gpus.get(job, []):
                if holder.get(gpu) == job:
                    del holder[gpu]


def test_an_urgent_job_takes_a_preemptible_jobs_gpu_which_then_finishes_its_work_intact(tmp_path: Path) -> None:
    queue = _queue(tmp_path)
    try:
        (first, counts1), (second, counts2) = _counters(queue, 600, "--preemptible")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        # It needs 70 of a GPU's 80 GiB: only once a counter's 60 GiB left the GPU does it start, and succeed.
        assert queue.wait_state(urgent, "succeeded", "failed", timeout=60)["state"] == "succeeded"
        preempted = [e for e in _events(queue) if e.get("event") == "preempted"]
        assert len(preempted) == 1 and preempted[0]["for"] == urgent and preempted[0]["why"] == "priority 10 > 0"
        victim = preempted[0]["job"]
        assert victim in (first, second)
        # The victim was suspended, said why, resumed by itself once the urgent job ended, and finishes intact.
        for job, counts in ((first, counts1), (second, counts2)):
            assert queue.wait_state(job, "succeeded", "failed", timeout=90)["state"] == "succeeded"
            assert counted(counts) == list(range(1, 601))
        events = _events(queue)
        kinds = [e["event"] for e in events if e.get("job") == victim]
        assert kinds.index("suspended") < kinds.index("resumed")
        started = next(e["t"] for e in events if e.get("job") == urgent and e["event"] == "started")
        suspended = next(e["t"] for e in events if e.get("job") == victim and e["event"] == "suspended")
        resumed = next(e["t"] for e in events if e.get("job") == victim and e["event"] == "resuming")
        ended = next(e["t"] for e in events if e.get("job") == urgent and e["event"] == "succeeded")
        assert suspended <= started and ended <= resumed  # after its checkpoint, and back only after the end
        other = second if victim == first else first
        assert "suspended" not in [e["event"] for e in events if e.get("job") == other]
        shown = queue.job(victim)
        assert shown["suspended_for"] > 0 and shown["preemptions"] == 1 and shown["suspends"] == 1
        assert shown["bytes_moved"] == preempted_bytes(events, victim) > 60 * 2**30
        assert "preempted once; suspended once, 60.5G moved, " in queue.run("show", str(victim)).stdout
        assert "PREEMPTED  REQUEUED  SUSPENDS  MOVED  SUSPENDED" in queue.run("report").stdout
        queue.run("report", "--html", str(tmp_path / "report.html"))  # the page has the same table, and per job
        page = (tmp_path / "report.html").read_text()
        user = shown["user"]
        assert f"<tr><td>{user}</td><td>1</td><td>0</td><td>1</td><td>60.5G</td>" in page
        assert f"<tr><td>{victim}</td><td>fake_counter.py</td><td>{user}</td><td>1</td><td>0</td><td>1</td>" in page
        _never_double_booked(events)
    finally:
        queue.cleanup()


def test_status_says_who_preempted_whom_and_why_and_the_victims_place_is_kept(tmp_path: Path) -> None:
    """One GPU: a packed preemptible job of 40 GiB, an urgent one of 60 GiB. Once the urgent one runs, a small
    job that would fit beside it, were the victim's memory free, waits: the victim's place is kept, and the
    victim comes back before the small job starts."""
    queue = fake_cuda_queue(
        tmp_path, "1x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB", GPUQ_PREEMPT="on", GPUQ_PREEMPT_MIN_RUNTIME="1s"
    )
    shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
    try:
        counts = queue.cwd / "counts"
        victim = queue.submit("--preemptible", "--mem", "40G", "fake_counter.py", "40", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(victim)["peak_mem"], 30, "the job to count")
        urgent = queue.submit("--priority", "10", "--mem", "60G", "fake_cuda.py", "60", "600")
        queue.wait_state(urgent, "running", timeout=60)
        shown = queue.job(victim)
        assert shown["state"] == "suspended"
        assert shown["reason"] == f"suspended for job {urgent} (priority 10 > 0); 40.5 GiB in host memory"
        assert f"suspended for job {urgent} (priority 10 > 0)" in queue.run("status").stdout
        small = queue.submit("--preemptible", "--mem", "10G", "fake_cuda.py", "10", "0.2")
        wait_for(lambda: queue.job(small)["reason"], 30, "the small job's reason to wait")
        assert queue.job(small)["state"] == "pending"
        queue.run("cancel", str(urgent))
        assert queue.wait_state(small, "succeeded", "failed")["state"] == "succeeded"
        events = _events(queue)
        resumed = next(e["t"] for e in events if e.get("job") == victim and e["event"] == "resuming")
        started = next(e["t"] for e in events if e.get("job") == small and e["event"] == "started")
        assert resumed <= started
        assert queue.job(victim)["state"] == "running"
    finally:
        queue.cleanup()


def test_a_job_that_is_not_preemptible_is_never_touched(tmp_path: Path) -> None:
    queue = _queue(tmp_path)
    try:
        jobs = _counters(queue, 100_000)  # not --preemptible
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        wait_for(lambda: queue.job(urgent)["reason"], 30, "the urgent job's reason to wait")
        _untouched(queue, jobs, urgent)
        assert not [e for e in _events(queue) if e.get("event") in ("preempted", "suspending")]
        queue.run("cancel", *(str(job) for job, _ in jobs))
        assert queue.wait_state(urgent, "succeeded", "failed")["state"] == "succeeded"
    finally:
        queue.cleanup()


def test_a_job_below_its_minimum_runtime_is_not_preempted(tmp_path: Path) -> None:
    queue = _queue(tmp_path, GPUQ_PREEMPT_MIN_RUNTIME="1h")
    try:
        jobs = _counters(queue, 100_000, "--preemptible")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        _untouched(queue, jobs, urgent)
        assert not [e for e in _events(queue) if e.get("event") == "preempted"]
    finally:
        queue.cleanup()


def test_preemption_is_off_unless_the_queue_turns_it_on(tmp_path: Path) -> None:
    queue = _queue(tmp_path, GPUQ_PREEMPT="off")
    try:
        jobs = _counters(queue, 100_000, "--preemptible")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        _untouched(queue, jobs, urgent)
    finally:
        queue.cleanup()


PREEMPTIBLE = Path(__file__).parent / "fixtures" / "fake_preemptible.py"


def _requeue_queue(tmp_path: Path, **extra: str) -> Gpuq:
    """One GPU, and a host too small to hold a 60 GiB job's GPU state: it cannot be suspended."""
    queue = fake_cuda_queue(
        tmp_path,
        "1x80GiB",
        **{
            "GPUQ_FAKE_HOST_MEMORY": "32GiB",
            "GPUQ_PREEMPT": "on",
            "GPUQ_PREEMPT_MIN_RUNTIME": "1s",
            **extra,
        },
    )
    shutil.copy(PREEMPTIBLE, queue.cwd / "fake_preemptible.py")
    return queue


def test_a_job_that_cannot_be_suspended_is_signalled_requeued_and_goes_on_from_its_saved_work(tmp_path: Path) -> None:
    queue = _requeue_queue(tmp_path)
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("--preemptible", "--retries", "0", "fake_preemptible.py", "60", str(counts), "400")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        assert queue.wait_state(urgent, "succeeded", "failed", timeout=60)["state"] == "succeeded"
        assert queue.wait_state(job, "succeeded", "failed", timeout=90)["state"] == "succeeded"
        assert counted(counts) == list(range(1, 401))  # nothing lost, nothing counted twice
        assert counts.with_suffix(".starts").read_text().splitlines() == [" ", "1 1"]
        preempted = [e for e in _events(queue) if e.get("event") == "preempted"]
        assert len(preempted) == 1 and preempted[0]["job"] == job and preempted[0]["for"] == urgent
        assert "would not fit in the host's 32.0 GiB" in preempted[0]["requeue"]
        requeued = [e for e in _events(queue) if e.get("job") == job and e.get("event") == "requeued"]
        assert len(requeued) == 1 and "not counted against its retries" in requeued[0]["reason"]
        assert queue.job(job)["attempt"] == 1  # --retries 0, and it ran again all the same
        _never_double_booked(_events(queue))
    finally:
        queue.cleanup()


def test_a_job_that_ignores_its_signal_is_stopped_after_the_grace_period_and_requeued(tmp_path: Path) -> None:
    queue = _requeue_queue(tmp_path, GPUQ_PREEMPT_GRACE="1s")
    try:
        counts = queue.cwd / "counts"
        shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
        ignores = ["sh", "-c", 'trap "" USR2; exec "$@"', "sh", sys.executable, "fake_counter.py"]  # USR2 ignored
        job = queue.submit("--preemptible", "--preempt-signal", "USR2", *ignores, "60", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "600")
        queue.wait_state(urgent, "running", timeout=60)
        queue.wait_state(job, "pending")  # (and at once staged to follow the urgent job: its place is kept)
        requeued = wait_for(lambda: [e for e in _events(queue) if e.get("job") == job and e["event"] == "requeued"], 30)
        assert requeued[0]["reason"].startswith("queued again, not counted against its retries: preempted for job")
        queue.run("cancel", str(urgent), str(job))
    finally:
        queue.cleanup()


def test_a_job_neither_suspendable_nor_preemptible_is_never_touched(tmp_path: Path) -> None:
    """Lower priority makes it preemptible by policy, but it cannot be suspended and did not say it can be
    requeued (--preemptible): it runs on."""
    queue = _requeue_queue(tmp_path, GPUQ_PREEMPT_BY="priority")
    shutil.copy(COUNTER, queue.cwd / "fake_counter.py")
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("fake_counter.py", "60", str(counts), "100000")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        wait_for(lambda: queue.job(urgent)["reason"], 30, "the urgent job's reason to wait")
        before = len(counted(counts))
        wait_for(lambda: len(counted(counts)) > before + 20, 30, "the job to count on")
        assert queue.job(job)["state"] == "running" and queue.job(urgent)["state"] == "pending"
        assert not [e for e in _events(queue) if e.get("event") == "preempted"]
    finally:
        queue.cleanup()


TRAINER = """\
import json, os, signal, sys, time
from pathlib import Path
from gpuq_scheduler import Executor, Resubmit, submit

class Trainer:
    \"\"\"Counts STEPS steps into a file, holding 60 GiB of its fake GPU; checkpointable as submitit's are.\"\"\"

    def __init__(self, out):
        self.out, self.done = out, 0

    def __call__(self, steps, start=0):
        usage = Path(os.environ["GPUQ_FAKE_USAGE"]) / f"{os.getpid()}.json"
        usage.write_text(json.dumps({os.environ["CUDA_VISIBLE_DEVICES"]: 61 << 30}))
        self.done = start
        preempt = getattr(signal, os.environ["GPUQ_PREEMPT_SIGNAL"])
        with open(self.out, "a") as out:
            while self.done < steps:
                # A step is whole when checkpoint() runs: the preemption signal waits until it is done.
                signal.pthread_sigmask(signal.SIG_BLOCK, {preempt})
                self.done += 1
                out.write(f"{self.done}\\n")
                out.flush()
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {preempt})
                time.sleep(0.02)
        usage.unlink()
        return {"started_at": start, "restarts": os.environ.get("GPUQ_RESTART_COUNT")}

    def checkpoint(self, steps, start=0):
        Path(os.environ["GPUQ_FAKE_USAGE"], f"{os.getpid()}.json").unlink(missing_ok=True)
        return Resubmit(self, steps, start=self.done)

counts = Path(sys.argv[1])
job = Executor(gpus=1, preemptible=True).submit(Trainer(str(counts)), 400)
deadline = time.monotonic() + 60
while len(counts.read_text().split() if counts.exists() else []) < 20 and time.monotonic() < deadline:
    time.sleep(0.05)
urgent = submit(["python3", "fake_cuda.py", "70", "1"], priority=10)
print(json.dumps({"result": job.result(timeout=120), "urgent": urgent}))
"""


def test_an_executor_functions_checkpoint_gives_the_call_its_requeued_run_makes(tmp_path: Path) -> None:
    queue = _requeue_queue(tmp_path)
    try:
        counts = queue.cwd / "counts"
        (queue.cwd / "trainer.py").write_text(TRAINER)
        done = subprocess.run(
            [sys.executable, "trainer.py", str(counts)],
            cwd=queue.cwd,
            env=queue.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["result"]["restarts"] == "1" and 20 <= out["result"]["started_at"] < 400
        assert counted(counts) == list(range(1, 401))  # the requeued run went on from the checkpoint
        assert queue.job(out["urgent"])["state"] == "succeeded"
    finally:
        queue.cleanup()


def test_a_job_whose_suspend_the_driver_refuses_is_requeued_instead(tmp_path: Path) -> None:
    """An MPS client: the driver's lock answers 801 (the fake's too) once the suspend is tried; the
    --preemptible job is then signalled and requeued, and goes on from its save."""
    queue = _requeue_queue(tmp_path, GPUQ_FAKE_HOST_MEMORY="256GiB", CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "mps"))
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("--preemptible", "fake_preemptible.py", "60", str(counts), "400")
        wait_for(lambda: len(counted(counts)) > 5 and queue.job(job)["peak_mem"], 30, "the job to count")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        assert queue.wait_state(urgent, "succeeded", "failed", timeout=60)["state"] == "succeeded"
        assert queue.wait_state(job, "succeeded", "failed", timeout=90)["state"] == "succeeded"
        assert counted(counts) == list(range(1, 401))
        kinds = [e["event"] for e in _events(queue) if e.get("job") == job]
        assert kinds.count("preempted") == 2 and "suspend-undone" in kinds and "requeued" in kinds
        _never_double_booked(_events(queue))
    finally:
        queue.cleanup()


def test_a_daemon_killed_while_a_victim_is_suspended_resumes_it_once_its_preemptor_ends(tmp_path: Path) -> None:
    queue = _queue(tmp_path)
    try:
        [(first, counts1), (second, counts2)] = _counters(queue, 100_000, "--preemptible")
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "600")
        queue.wait_state(urgent, "running", timeout=60)
        pairs = ((first, counts1), (second, counts2))
        victim, counts = next((j, c) for j, c in pairs if queue.job(j)["state"] == "suspended")
        queue.kill_daemon()
        queue.run("daemon", "start")
        # The restarted daemon knows whom it waits for (the pause file), and resumes it once that one ended.
        other = queue.submit("--gpus", "0", "true")
        queue.wait_state(other, "succeeded")  # a pass or more of the new daemon went by
        assert queue.job(victim)["state"] == "suspended"
        assert queue.job(victim)["reason"].startswith(f"suspended for job {urgent} (priority 10 > 0)")
        queue.run("cancel", str(urgent))
        queue.wait_state(victim, "running", timeout=60)
        before = len(counted(counts))
        wait_for(lambda: len(counted(counts)) > before + 5, 30, "the victim to count on")
        seen = counted(counts)
        assert seen == list(range(1, len(seen) + 1))  # on from where it stopped
        _never_double_booked(_events(queue))
    finally:
        queue.cleanup()


def test_a_job_of_several_nccl_processes_is_not_suspended_but_requeued_if_preemptible(tmp_path: Path) -> None:
    """A job that starts its own ranks (not --mode torchrun): two CUDA processes with NCCL loaded. `gpuq
    suspend` is refused, saying why; preempted, it is requeued instead of suspended."""
    queue = _requeue_queue(tmp_path, GPUQ_FAKE_HOST_MEMORY="256GiB")
    shutil.copy(Path(__file__).parent / "fixtures" / "fake_nccl_pair.py", queue.cwd / "fake_nccl_pair.py")
    libm = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "/libm." in line)
    shutil.copy(libm, queue.cwd / "libnccl.so.2")  # any shared library will do: gpuq goes by its name
    try:
        counts = queue.cwd / "counts"
        job = queue.submit("--preemptible", "fake_nccl_pair.py", "20", str(queue.cwd / "libnccl.so.2"), str(counts))
        wait_for(lambda: set(counted(counts)) == {0, 1} and queue.job(job)["peak_mem"], 30, "both ranks to count")
        wait_for(lambda: len(queue.job(job)["gpus"]) == 1 and _fake_cuda_processes(queue) == 2, 30, "both ranks seen")
        queue.run("suspend", str(job))
        refused = wait_for(lambda: "not suspended" in (shown := queue.job(job))["reason"] and shown, 30, "a refusal")
        assert refused["state"] == "running"
        assert refused["reason"] == (
            "not suspended: it runs several CUDA processes that use NCCL, whose state the driver's checkpoint "
            "does not cover"
        )
        urgent = queue.submit("--priority", "10", "fake_cuda.py", "70", "1")
        assert queue.wait_state(urgent, "succeeded", "failed", timeout=60)["state"] == "succeeded"
        preempted = [e for e in _events(queue) if e.get("event") == "preempted"]
        assert [e["job"] for e in preempted] == [job] and "NCCL" in preempted[0]["requeue"]
        assert not [e for e in _events(queue) if e.get("job") == job and e.get("event") == "suspending"]
        queue.run("cancel", str(job))
    finally:
        queue.cleanup()


def _fake_cuda_processes(queue: Gpuq) -> int:
    """How many processes the fake GPUs list (the usage files the fixtures write)."""
    usage = Path(queue.env["GPUQ_FAKE_USAGE"])
    return len(list(usage.glob("*.json")))

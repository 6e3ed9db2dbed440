"""Scripts written for submitit, run through gpuq with one changed import (#43): the patterns of submitit's
README and documentation, written here, each a real user script in a subprocess against a real daemon on fake
GPUs; the functions run in real job processes. The same script against a real Slurm: test_submitit_slurm.py."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gpuq, counted
from tests.test_preemption import _events, _requeue_queue

HEADER = """\
import json, os, sys, time, warnings
import gpuq_scheduler.submitit as submitit
"""


def run_script(gpuq: Gpuq, body: str, *args: str, timeout: float = 180) -> tuple[Any, str]:
    """Run a user's script (HEADER + body) in the work directory: (the JSON it printed last, its stderr)."""
    path = gpuq.cwd / "script.py"
    path.write_text(HEADER + textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, str(path), *args],
        cwd=gpuq.cwd,
        env=gpuq.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_readme_addition_runs_with_one_changed_import(gpuq: Gpuq) -> None:
    found, stderr = run_script(
        gpuq,
        """
        def add(a, b):
            return a + b

        executor = submitit.AutoExecutor(folder="log_test/%j")
        executor.update_parameters(timeout_min=1, slurm_partition="dev")
        job = executor.submit(add, 5, 7)
        output = job.result()
        assert output == 12
        again = executor.submit(add, 1, 2).result()    # the same executor again: nothing said twice
        import asyncio, shutil
        async def both():
            jobs = [executor.submit(add, 2, 2), executor.submit(add, 3, 3)]
            return await asyncio.gather(*(j.async_result(poll_frequency=0.05) for j in jobs))
        slow = executor.submit(time.sleep, 0.5)
        slow.wait()
        shaped = [slow.done(), slow.results(), slow.task(0).job_id == slow.job_id, slow.num_tasks, asyncio.run(both())]
        which = executor.submit(submitit.helpers.CommandFunction(["which", "python"])).result()
        failed = executor.submit(submitit.helpers.CommandFunction(["ls", "no such file"])).exception()
        print(json.dumps({"job_id": job.job_id, "state": job.state, "cluster": executor.cluster, "done": job.done(),
                          "paths": {k: str(v) for k, v in vars(job.paths).items()}, "again": again,
                          "which": [which, shutil.which("python")], "failed": [type(failed).__name__, str(failed)],
                          "shaped": shaped}))
    """,
    )
    assert found["state"] == "COMPLETED" and found["cluster"] == "local" and found["done"] and found["again"] == 3
    assert found["shaped"] == [True, [None], True, 1, [4, 6]]  # wait, results, task(0), async_result
    which, here = found["which"]
    assert which == here + "\n"  # a command as a function: the job runs the same interpreter as the script
    assert found["failed"][0] == "CommandFailed" and "ls no such file exited 2:" in found["failed"][1]
    record = gpuq.job(int(found["job_id"]))
    assert record["name"] == "add" and record["time_limit"] == 60.0 and record["gpus_requested"] == 0
    # slurm_partition means nothing on the workstation: said once, as a warning, naming where the jobs went.
    said = [line for line in stderr.splitlines() if "IgnoredParameter" in line]
    assert said == [
        f"{gpuq.cwd / 'script.py'}:8: IgnoredParameter: slurm_partition does nothing here: it is the slurm "
        "executor's, and these jobs go to this workstation's gpuq queue"
    ]
    # The folder before its %j holds the pickles, each submit in a folder of its own.
    paths = found["paths"]
    assert Path(paths["folder"]).parent == gpuq.cwd / "log_test" and Path(paths["result_pickle"]).exists()
    assert paths["stdout"] == record["log"]


def test_map_array_and_batch_are_one_array_each_and_as_completed_yields_every_job(gpuq: Gpuq) -> None:
    found, _ = run_script(
        gpuq,
        """
        def add(a, b):
            return a + b

        def timed_add(a, b):
            started = time.time()
            time.sleep(0.3)
            return a + b, started, time.time()

        def scale(x, *, by):
            return x * by

        executor = submitit.AutoExecutor(folder="log_test")
        executor.update_parameters(slurm_array_parallelism=2)
        a, b = [1, 2, 3, 4], [10, 20, 30, 40]
        mapped = executor.map_array(timed_add, a, b)
        jobs = []
        with executor.batch():
            for x in range(3):
                jobs.append(executor.submit(scale, x, by=10))
            jobs.append(executor.submit(add, 100, 1))
            try:
                jobs[0].job_id
                inside = "readable"
            except RuntimeError as err:
                inside = str(err)
        try:
            with executor.batch():
                executor.submit(add, 0, 0)
                raise KeyError("stop")
        except KeyError:
            pass
        ended = [job.job_id for job in submitit.helpers.as_completed(mapped + jobs, timeout=120)]
        print(json.dumps({"mapped": [j.result()[0] for j in mapped], "spans": [j.result()[1:] for j in mapped],
                          "batched": [j.result() for j in jobs],
                          "ids": [j.job_id for j in mapped + jobs], "ended": ended, "inside": inside,
                          "empty": executor.map_array(add, [], [])}))
    """,
    )
    assert found["mapped"] == [11, 22, 33, 44] and found["batched"] == [0, 10, 20, 101]
    assert sorted(found["ended"]) == sorted(found["ids"])
    assert found["inside"] == "this job is queued when its executor.batch() block ends: use it after the block"
    assert found["empty"] == []
    records = {r["id"]: r for r in gpuq.status()}
    ids = [int(i) for i in found["ids"]]
    assert {records[i]["array_id"] for i in ids[:4]} == {ids[0] - 1}  # map_array: one array
    assert {records[i]["array_id"] for i in ids[4:]} == {ids[4] - 1}  # batch(): one array of its four calls
    assert sorted(records) == sorted(ids)  # the batch that raised queued nothing
    spans = found["spans"]
    assert max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans) <= 2  # as the functions saw it
    with sqlite3.connect(gpuq.home / "jobs.db") as db:
        throttles = dict(db.execute("SELECT id, throttle FROM arrays").fetchall())
    assert throttles == {ids[0] - 1: 2, ids[4] - 1: 2}  # slurm_array_parallelism, for batch() too


def test_update_parameters_are_gpuq_options_and_what_means_nothing_here_is_said_once(gpuq: Gpuq) -> None:
    found, stderr = run_script(
        gpuq,
        """
        executor = submitit.AutoExecutor(folder="log_test")
        executor.update_parameters(timeout_min=2, gpus_per_node=2, name="trainer", local_visible_gpus=(2, 3),
                                   gpuq_priority=3, local_setup=["module load cuda"], slurm_qos="high")
        executor.update_parameters(local_setup=["module load cuda"], slurm_qos="low")  # said already
        where = executor.submit(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
        local = submitit.LocalExecutor(folder="log_test")
        local.update_parameters(timeout_min=1, gpus_per_node=1, visible_gpus=(1, 0), mem_gb=2, cpus_per_task=3)
        one = local.submit(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
        from gpuq_scheduler import status
        limits = [status([int(one.job_id)])[0].spec.cpus, status([int(one.job_id)])[0].spec.ram]
        refused = {}
        for name, make in {
            "unknown": lambda: executor.update_parameters(gpus=1),
            "unknown_prefixed": lambda: executor.update_parameters(slurm_partitions="dev"),
            "tasks": lambda: executor.update_parameters(tasks_per_node=4),
            "nodes": lambda: executor.update_parameters(nodes=2),
            "bad_type": lambda: executor.update_parameters(timeout_min="ten"),
            "constructor": lambda: submitit.AutoExecutor(folder="x", max_num_timeout=3),
            "debug": lambda: submitit.AutoExecutor(folder="x", cluster="debug"),
            "no_id": lambda: submitit.Job("log_test"),
            "slurm_id": lambda: submitit.Job("log_test", "17_3"),
        }.items():
            try:
                make()
                refused[name] = "accepted"
            except Exception as err:
                refused[name] = [type(err).__name__, isinstance(err, NameError), str(err)]
        print(json.dumps({"ids": [where.job_id, one.job_id], "visible": [where.result(), one.result()],
                          "refused": refused, "kept": executor.parameters,
                          "limits": limits}))
    """,
    )
    first, second = (gpuq.job(int(i)) for i in found["ids"])
    assert found["visible"] == ["2,3", "1"]
    assert first["gpus"] == [2, 3] and first["time_limit"] == 120.0 and first["name"] == "trainer"
    assert first["priority"] == 3 and second["gpus"] == [1] and second["time_limit"] == 60.0
    said = [line.split("IgnoredParameter: ")[1] for line in stderr.splitlines() if "IgnoredParameter" in line]
    assert said[:2] == [
        "local_setup does nothing here: gpuq runs no shell lines before the function: put them in the function or "
        "the environment",
        "slurm_qos does nothing here: it is the slurm executor's, and these jobs go to this workstation's gpuq queue",
    ]
    # cpus_per_task and mem_gb are host limits where this queue's daemon can enforce them (a cgroup's controllers
    # delegated to it), else said once and left out, as submitit's LocalExecutor ignores them: never refused.
    have = json.loads((gpuq.home / "gpus.json").read_text())["containment"]["controllers"]
    cpus, ram = found["limits"]
    assert (cpus == 3.0) == ("cpu" in have) and (ram == 2 << 30) == ("memory" in have)
    assert [line.split(" does nothing here: this queue cannot enforce a host")[0] for line in said[2:]] == [
        *(["cpus_per_task"] if "cpu" not in have else []),
        *(["mem_gb"] if "memory" not in have else []),
    ]
    refused = found["refused"]
    assert refused["unknown"] == [
        "UnknownParameter",
        True,
        "update_parameters: unknown parameter(s) gpus: use submitit's generic names (name, timeout_min, mem_gb, "
        "nodes, cpus_per_task, gpus_per_node, tasks_per_node, stderr_to_stdout), an executor's own prefixed by slurm_ "
        "or local_, or gpuq_<gpuq submit option>",
    ]
    assert refused["unknown_prefixed"][:2] == ["UnknownParameter", True]
    assert refused["tasks"][2].startswith("tasks_per_node=4: gpuq runs the function once per job")
    assert refused["nodes"][2].startswith("nodes=2: gpuq runs a job on one machine")
    assert refused["bad_type"] == ["BadInput", False, "timeout_min='ten': give a positive number"]
    assert refused["constructor"][0] == "UnknownParameter" and "max_num_timeout" in refused["constructor"][2]
    assert refused["debug"][2].startswith("cluster='debug' runs jobs inside this process in submitit")
    assert refused["no_id"][2] == "Job('log_test'): give the job's id, Job(folder, job_id) or Job(job_id)"
    assert refused["slurm_id"][2] == "job_id '17_3': gpuq's job ids are numbers (an array's members have their own)"
    assert found["kept"]["slurm_qos"] == "low" and "tasks_per_node" not in found["kept"]  # refused: nothing kept
    assert len(gpuq.status()) == 2


def test_an_exception_in_the_job_is_raised_here_and_its_streams_are_read(gpuq: Gpuq) -> None:
    found, _ = run_script(
        gpuq,
        """
        import traceback
        from operator import truediv

        def noisy(x):
            print("to stdout", flush=True)
            print("to stderr", file=sys.stderr, flush=True)
            return truediv(1, x)

        executor = submitit.AutoExecutor(folder="log_test")
        job = executor.submit(noisy, 0)
        try:
            job.result()
            raised = None
        except ZeroDivisionError as err:
            raised = "".join(traceback.format_exception(err))
        forever = executor.submit(time.sleep, 600)
        while forever.state != "RUNNING":
            time.sleep(0.1)
        forever.cancel()
        lost = forever.exception()
        rebuilt = submitit.Job("log_test", job.job_id)       # from its id, as in another process
        print(json.dumps({"raised": raised, "exception": repr(job.exception()), "state": job.state,
                          "stdout": job.stdout(), "stderr": job.stderr(), "lost": [type(lost).__name__, str(lost)],
                          "cancelled": forever.state, "rebuilt": repr(rebuilt.exception())}))
    """,
    )
    assert "ZeroDivisionError: division by zero" in found["raised"] and "in noisy" in found["raised"]
    assert "RemoteTraceback" in found["raised"]  # where it happened in the job, as the cause
    assert found["exception"] == found["rebuilt"] == "ZeroDivisionError('division by zero')"
    assert found["state"] == "FAILED" and found["cancelled"] == "CANCELLED"
    assert "to stdout" in found["stdout"] and "to stderr" in found["stdout"]  # gpuq's log: both streams
    assert "to stderr" in found["stderr"] and "to stdout" not in found["stderr"]
    assert "ZeroDivisionError" in found["stderr"]
    kind, message = found["lost"]
    assert kind == "UncompletedJobError" and "cancelled without a result: cancelled by" in message


TRAINER = """\
import json, os, signal, sys, time
from pathlib import Path
import gpuq_scheduler.submitit as submitit
from gpuq_scheduler import submit


class Trainer(submitit.helpers.Checkpointable):
    \"\"\"Counts STEPS steps into a file, holding 60 GiB of its fake GPU. Its progress is its own attribute, so
    the checkpoint it inherits (the callable as it is now, the same arguments) resumes it.\"\"\"

    def __init__(self):
        self.done = 0

    def __call__(self, counts, checkpoint, steps):
        usage = Path(os.environ["GPUQ_FAKE_USAGE"]) / f"{os.getpid()}.json"
        usage.write_text(json.dumps({os.environ["CUDA_VISIBLE_DEVICES"]: 61 << 30}))
        start = self.done = self.load(checkpoint)
        preempt = getattr(signal, os.environ["GPUQ_PREEMPT_SIGNAL"])
        try:
            with open(counts, "a") as out:
                while self.done < steps:
                    # A step is whole when checkpoint() runs: the preemption signal waits until it is done.
                    signal.pthread_sigmask(signal.SIG_BLOCK, {preempt})
                    self.done += 1
                    out.write(f"{self.done}\\n")
                    out.flush()
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {preempt})
                    time.sleep(0.02)
        finally:  # preempted too: gpuq's runner ends the call with an exception once checkpoint() has run
            usage.unlink(missing_ok=True)
        return {"started_at": start, "restarts": os.environ.get("GPUQ_RESTART_COUNT"),
                "job": submitit.JobEnvironment().job_id}

    def load(self, checkpoint):
        return self.done


class SavingTrainer(Trainer):
    \"\"\"submitit's training recipe: the checkpoint saves to a file of its own and resubmits a fresh callable,
    which picks up from that file.\"\"\"

    def load(self, checkpoint):
        return int(Path(checkpoint).read_text()) if Path(checkpoint).exists() else 0

    def checkpoint(self, counts, checkpoint, steps):
        Path(checkpoint).write_text(str(self.done))
        return submitit.helpers.DelayedSubmission(SavingTrainer(), counts, checkpoint, steps)


class Declining(Trainer):
    \"\"\"A checkpoint that returns None: submitit does not requeue the job then.\"\"\"

    def checkpoint(self, counts, checkpoint, steps):
        Path(checkpoint).write_text(str(self.done))
        return None


counts, saved, kind = sys.argv[1], sys.argv[2], sys.argv[3]
executor = submitit.AutoExecutor(folder="log_test")
executor.update_parameters(gpus_per_node=1)
trainer = {"inherited": Trainer, "saving": SavingTrainer, "declining": Declining}[kind]()
job = executor.submit(trainer, counts, saved, 400)
while len(Path(counts).read_text().split() if Path(counts).exists() else []) < 20:
    time.sleep(0.05)
urgent = submit(["python3", "fake_cuda.py", "70", "1"], priority=10)
error = job.exception(timeout=120)
print(json.dumps({"result": None if error else job.result(), "error": repr(error), "id": job.job_id,
                  "urgent": urgent, "resubmitted": type(job.submission().function).__name__}))
"""


@pytest.mark.parametrize("kind", ["inherited", "saving", "declining"])
def test_a_preempted_checkpointable_resumes_from_its_own_checkpoint(tmp_path: Path, kind: str) -> None:
    """One GPU and a host too small to hold the job's GPU state: gpuq cannot suspend it, so it signals it, the
    job's checkpoint() runs, the job is requeued and the call the checkpoint returned goes on where it left off:
    from the callable's own state (inherited), or from the file its checkpoint wrote (saving). A checkpoint that
    returns None (declining) ends the job there, as submitit requeues nothing then."""
    queue = _requeue_queue(tmp_path)
    try:
        counts, saved = queue.cwd / "counts", queue.cwd / "saved"
        (queue.cwd / "trainer.py").write_text(TRAINER)
        done = subprocess.run(
            [sys.executable, "trainer.py", str(counts), str(saved), kind],
            cwd=queue.cwd,
            env=queue.env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        out = json.loads(done.stdout.strip().splitlines()[-1])
        job = int(out["id"])
        assert "yes (SIGUSR1 where it cannot be suspended)" in queue.run("show", str(job)).stdout  # --preemptible
        events = [e["event"] for e in _events(queue) if e.get("job") == job]
        assert [e for e in events if e in ("preempted", "requeued")] == ["preempted", "requeued"]
        assert queue.job(out["urgent"])["state"] == "succeeded"
        checkpointed = int(saved.read_text()) if saved.exists() else None
        if kind == "declining":
            assert out["error"].startswith("NotRequeued(\"Declining's checkpoint() returned None when the job")
            assert queue.job(job)["state"] == "failed" and counted(counts) == list(range(1, checkpointed + 1))
            return
        assert out["result"]["job"] == out["id"] and out["result"]["restarts"] == "1"
        assert out["resubmitted"] == type_name[kind]  # the call the checkpoint returned, as the requeued run made it
        assert 20 <= out["result"]["started_at"] < 400
        if kind == "saving":
            assert out["result"]["started_at"] == checkpointed  # from its own checkpoint file
        assert counted(counts) == list(range(1, 401))  # nothing lost, nothing counted twice
        assert queue.job(job)["state"] == "succeeded"
    finally:
        queue.cleanup()


type_name = {"inherited": "Trainer", "saving": "SavingTrainer"}

"""Python functions as jobs (``Executor``): real user scripts that define functions in ``__main__`` and
lambdas, run as subprocesses against a real daemon on fake GPUs; the functions run in real job processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Gpuq

HEADER = """\
import dataclasses, json, os, sys, time
from gpuq_scheduler import Executor, Job, JobFailed, as_completed, wait_all
"""


def script(gpuq: Gpuq, body: str, *args: str, check: bool = True, timeout: float = 120) -> Any:
    """Run a user's script (HEADER + body) from the work directory; return the JSON it printed last."""
    path = gpuq.cwd / "sweep.py"
    path.write_text(HEADER + textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, str(path), *args],
        cwd=gpuq.cwd,
        env=gpuq.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_return_values_of_several_types_come_back_from_main_functions_and_lambdas(gpuq: Gpuq) -> None:
    found = script(
        gpuq,
        """
        @dataclasses.dataclass
        class Score:
            lr: float
            accuracy: float

        def train(lr, *, epochs):
            return Score(lr, round(1 - lr * epochs, 3))

        executor = Executor(gpus=1, mem="2G")
        jobs = {
            "dataclass": executor.submit(train, 0.01, epochs=3),
            "lambda": executor.submit(lambda a, b: a * b, 6, 7),
            "nested": executor.submit(lambda: {"a": [1, 2.5, None], "b": ("x", b"\\x00")}),
            "none": executor.submit(print, "printed by the job"),
            "gpus": executor.submit(lambda: (os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUQ_JOB_ID"])),
            "cwd": Executor(gpus=0).submit(os.getcwd),
        }
        out = {name: job.result(timeout=60) for name, job in jobs.items()}
        score = out.pop("dataclass")
        out["dataclass"] = [type(score).__name__, score.lr, score.accuracy]
        out["nested"] = repr(out["nested"])
        out["ids"] = {name: job.id for name, job in jobs.items()}
        out["printed"] = jobs["none"].stdout()
        print(json.dumps(out))
    """,
    )
    assert found["dataclass"] == ["Score", 0.01, 0.97]
    assert found["lambda"] == 42
    assert found["nested"] == "{'a': [1, 2.5, None], 'b': ('x', b'\\x00')}"
    assert found["none"] is None and "printed by the job" in found["printed"]
    visible, job_id = found["gpus"]
    assert visible in {"0", "1", "2", "3"} and int(job_id) == found["ids"]["gpus"]
    assert found["cwd"] == str(gpuq.cwd)  # the submitter's cwd
    names = {r["id"]: r["name"] for r in gpuq.status()}
    assert names[found["ids"]["dataclass"]] == "train" and names[found["ids"]["lambda"]] == "<lambda>"


def test_an_exception_is_raised_again_with_the_jobs_traceback(gpuq: Gpuq) -> None:
    found = script(
        gpuq,
        """
        import traceback

        def check(lr):
            if lr > 1:
                raise ValueError(f"learning rate {lr} is too high")
            return lr

        def train(lr):
            print("starting", flush=True)
            return check(lr)

        job = Executor(gpus=0).submit(train, 3)
        try:
            job.result(timeout=60)
            raised = None
        except ValueError as err:
            raised = {"type": type(err).__name__, "message": str(err),
                      "printed": "".join(traceback.format_exception(err))}
        again = Job(job.id).exception()
        import threading
        unpicklable = Executor(gpus=0).submit(threading.Lock).exception(timeout=60)
        print(json.dumps({"raised": raised, "again": repr(again), "stderr": job.stderr(), "log": job.stdout(),
                          "id": job.id, "unpicklable": repr(unpicklable)}))
    """,
    )
    assert found["unpicklable"].startswith("RuntimeError(\"the function's value could not be pickled: TypeError:")
    raised = found["raised"]
    assert raised["type"] == "ValueError" and raised["message"] == "learning rate 3 is too high"
    # The remote traceback is the cause: where it happened inside the job, with file and function names.
    printed = raised["printed"]
    assert "RemoteTraceback" in printed and 'sweep.py", line' in printed and "in check" in printed
    assert found["again"] == "ValueError('learning rate 3 is too high')"
    assert "ValueError: learning rate 3 is too high" in found["stderr"] and "starting" not in found["stderr"]
    assert "starting" in found["log"] and "ValueError" in found["log"]  # gpuq's log has both streams
    record = gpuq.job(found["id"])
    assert record["state"] == "failed" and record["reason"] == "ValueError: learning rate 3 is too high (exit code 1)"


def test_map_array_is_one_array_that_keeps_its_throttle(gpuq: Gpuq) -> None:
    found = script(
        gpuq,
        """
        def square(x, y):
            started = time.time()
            time.sleep(0.3)
            return x * y, started, time.time()

        jobs = Executor(gpus=0).map_array(square, range(50), range(50), throttle=4)
        done = [job.id for job in as_completed(jobs, timeout=240)]
        results = [job.result() for job in wait_all(jobs)]
        print(json.dumps({"results": results, "ids": [job.id for job in jobs], "done": done}))
    """,
        timeout=300,
    )
    results = found["results"]
    assert [r[0] for r in results] == [i * i for i in range(50)]
    assert sorted(found["done"]) == sorted(found["ids"]) == list(range(found["ids"][0], found["ids"][0] + 50))
    spans = [(r[1], r[2]) for r in results]
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    assert 1 < most <= 4  # never more than the throttle at once, as the functions themselves saw it
    members = [r for r in gpuq.status() if r["id"] in found["ids"]]
    assert {r["array_id"] for r in members} == {found["ids"][0] - 1}  # one array, not 50 submits
    assert sorted(r["array_index"] for r in members) == list(range(50))


def test_a_result_survives_kill_9_of_the_daemon_and_a_job_is_rebuilt_from_its_id(gpuq: Gpuq) -> None:
    first = script(
        gpuq,
        """
        def slow(n):
            time.sleep(4)
            return list(range(n))

        print(json.dumps({"id": Executor(gpus=1).submit(slow, 5).id}))
    """,
    )
    gpuq.wait_state(first["id"], "running")
    gpuq.kill_daemon()
    found = script(
        gpuq,
        """
        job = Job(int(sys.argv[1]))     # another process: only the id is known
        print(json.dumps({"result": job.result(timeout=60), "state": job.state.value, "done": job.done()}))
    """,
        str(first["id"]),
    )
    assert found == {"result": [0, 1, 2, 3, 4], "state": "succeeded", "done": True}
    assert gpuq.job(first["id"])["attempt"] == 1  # adopted by the next daemon, not run again


def test_a_job_that_ends_without_a_result_raises_job_failed_naming_what_gpuq_recorded(gpuq: Gpuq) -> None:
    found = script(
        gpuq,
        """
        def forever():
            time.sleep(600)

        def out_of_memory():
            print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", file=sys.stderr)
            os._exit(1)

        cancelled = Executor(gpus=0).submit(forever)
        timed = Executor(gpus=0, time="2s").submit(forever)
        oom = Executor(gpus=1, mem="1G").submit(out_of_memory)
        while cancelled.state.value != "running":
            time.sleep(0.1)
        assert cancelled.cancel()
        out = {}
        for name, job in (("cancelled", cancelled), ("timed", timed), ("oom", oom)):
            error = job.exception(timeout=60)
            out[name] = [type(error).__name__, str(error)]
        print(json.dumps(out))
    """,
    )
    assert found["cancelled"][0] == found["timed"][0] == found["oom"][0] == "JobFailed"
    assert "cancelled without a result: cancelled by" in found["cancelled"][1]
    assert "timeout without a result: time limit of 2s reached" in found["timed"][1]
    assert "failed without a result: CUDA out of memory at its 1.0G share (--mem 1.0G)" in found["oom"][1]


def test_bad_input_is_one_line_and_queues_nothing(gpuq: Gpuq) -> None:
    found = script(
        gpuq,
        """
        import threading
        out = []
        for make in (lambda: Executor(gpu=1), lambda: Executor().map_array(abs, []),
                     lambda: Executor().submit(lambda: lock, ), lambda: Executor(mem="lots").submit(abs, 1)):
            lock = threading.Lock()
            try:
                make()
                out.append("accepted")
            except Exception as err:
                out.append(f"{type(err).__name__}: {err}")
        print(json.dumps(out))
    """,
    )
    assert found[0] == "BadInput: Executor() got unknown option(s) gpu: use gpuq submit's names"
    assert found[1] == "BadInput: map_array needs at least one item to call the function with"
    assert found[2].startswith("BadInput: cannot send <lambda> to a job: TypeError:")
    assert found[3].startswith("BadInput: cannot read size 'lots'")
    assert gpuq.status() == []
    assert list((gpuq.home / "functions").iterdir()) == []  # no pickle left behind by a refused submit


@pytest.mark.skipif(
    os.geteuid() != 0 and not os.environ.get("CI"), reason="needs root to give a file to another user (CI runs as root)"
)
def test_a_result_is_unpickled_only_when_it_belongs_to_the_caller(gpuq: Gpuq) -> None:
    first = script(
        gpuq,
        """
        job = Executor(gpus=0).submit(abs, -3)
        print(json.dumps({"id": job.id, "result": job.result(timeout=60)}))
    """,
    )
    assert first["result"] == 3
    folders = list((gpuq.home / "functions").iterdir())
    assert [oct(f.stat().st_mode & 0o777) for f in [gpuq.home / "functions", *folders]] == ["0o700", "0o700"]
    (result,) = folders[0].glob("*.result.pkl")
    os.chown(result, 65534, 65534)  # as if someone else had put it there
    found = script(
        gpuq,
        """
        try:
            Job(int(sys.argv[1])).result()
        except Exception as err:
            print(json.dumps([type(err).__name__, str(err)]))
    """,
        str(first["id"]),
    )
    assert found[0] == "NotPermitted" and "belongs to uid 65534, not to you: it is not unpickled" in found[1]


def test_the_function_folder_of_a_queue_that_is_not_the_callers_is_in_the_callers_own_state_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuq_scheduler.jobs.functions.executor import default_folder

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state home"))
    assert default_folder(tmp_path / "mine") == tmp_path / "mine" / "functions"
    assert default_folder(tmp_path / "not made yet") == tmp_path / "not made yet" / "functions"
    theirs = Path("/")  # root's: a shared queue's state directory, to anyone but root
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
    assert default_folder(theirs) == tmp_path / "state home" / "gpuq" / "functions"

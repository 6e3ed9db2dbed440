"""Interactive work through the queue (`gpuq run`, `gpuq alloc`): real terminals (a pty), a real daemon,
fake GPUs."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuq_scheduler.launcher.supervisor import processes
from tests.conftest import Gpuq, fake_cuda_queue, wait_for


class Terminal:
    """`gpuq ARGS...` on a pseudo-terminal of its own, read and typed into as a person would."""

    def __init__(self, gpuq: Gpuq, *args: str, env: dict[str, str] | None = None) -> None:
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", gpuq.entry, *args],
            env=env or gpuq.env,
            cwd=gpuq.cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=_controlling_terminal,
        )
        os.close(slave)
        self.seen = b""

    def expect(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise AssertionError(f"no {text!r} on the terminal; it shows:\n{self.seen.decode(errors='replace')}")
            try:
                self.seen += os.read(self.master, 4096)
            except OSError:  # the other side closed
                raise AssertionError(f"the terminal closed before {text!r}:\n{self.seen.decode()}") from None
        return self.seen.decode(errors="replace")

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        code = self.proc.wait(timeout=60)
        os.close(self.master)
        return code


def _controlling_terminal() -> None:
    """In the child, in its new session: the pty on its stdin becomes its controlling terminal, as a login's is."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_gpuq_run_in_a_terminal_reads_input_sees_its_gpus_and_exits_with_its_code(gpuq: Gpuq) -> None:
    term = Terminal(gpuq, "run", "--gpus", "1", sys.executable, "-i", "-q")
    term.expect(">>> ")
    term.type("import os, sys; print('CVD', os.environ['CUDA_VISIBLE_DEVICES'], sys.stdin.isatty())\n")
    term.expect("CVD 0 True")
    term.type("exit(3)\n")
    assert term.close() == 3
    (job,) = gpuq.status()
    assert (job["state"], job["exit_code"], job["gpus"]) == ("failed", 3, [0])
    assert job["name"] == os.path.basename(sys.executable)


def test_gpuq_alloc_starts_a_shell_that_sees_the_allocation_and_leaving_it_releases_them(gpuq: Gpuq) -> None:
    term = Terminal(gpuq, "alloc", "--gpus", "2", env={**gpuq.env, "SHELL": "/bin/sh"})
    term.expect("until you leave this shell")
    term.type("echo GPUS=$CUDA_VISIBLE_DEVICES JOB=$GPUQ_JOB_ID; exit\n")
    screen = term.expect("GPUS=0,1 JOB=1")
    assert term.close() == 0, screen
    assert gpuq.wait_state(1, "succeeded")["gpus"] == [0, 1]


def test_ctrl_c_while_waiting_withdraws_the_job(gpuq: Gpuq) -> None:
    blocker = gpuq.submit("--gpus", "4", "sleep", "300")
    gpuq.wait_state(blocker, "running")
    client = subprocess.Popen(
        [sys.executable, "-m", gpuq.entry, "run", "--gpus", "1", "true"],
        env=gpuq.env,
        cwd=gpuq.cwd,
        stderr=subprocess.PIPE,
        text=True,
    )
    waiting = wait_for(lambda: [j for j in gpuq.status() if j["id"] != blocker and j["state"] == "pending"], 30)
    client.send_signal(signal.SIGINT)
    _, err = client.communicate(timeout=30)
    assert client.returncode == 130 and f"withdrew job {waiting[0]['id']}" in err
    assert gpuq.wait_state(waiting[0]["id"], "cancelled")["gpus"] == []
    gpuq.run("cancel", str(blocker))


def test_a_dropped_terminal_ends_the_program_and_frees_its_gpus_for_the_next_job(gpuq: Gpuq) -> None:
    pid_file = gpuq.cwd / "program.pid"
    client = subprocess.Popen(
        [sys.executable, "-m", gpuq.entry, "run", "--gpus", "4", "sh", "-c", f"echo $$ > '{pid_file}'; exec sleep 300"],
        env=gpuq.env,
        cwd=gpuq.cwd,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    program = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "the program"))
    nxt = gpuq.submit("--gpus", "4", "true")
    os.kill(client.pid, signal.SIGKILL)  # the ssh session dropped
    client.wait()
    ended = gpuq.wait_state(1, "failed", "cancelled", "succeeded", timeout=30)
    assert "SIGHUP" in ended["reason"]
    wait_for(lambda: not processes.is_alive(program, None), 10, "the program to end")
    assert gpuq.wait_state(nxt, "succeeded")["gpus"] == [0, 1, 2, 3]


def test_the_time_limit_stops_the_program_here(gpuq: Gpuq) -> None:
    done = gpuq.run("run", "--time", "1s", "sleep", "60", check=False)
    assert done.returncode == 128 + signal.SIGTERM and "stopping the program" in done.stderr
    assert gpuq.job(1)["state"] == "timeout"


def test_alloc_without_a_shell_hands_tools_its_environment_until_released(gpuq: Gpuq) -> None:
    held = json.loads(gpuq.run("alloc", "--no-shell", "--json", "--gpus", "2").stdout)
    inside = subprocess.run(
        ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES $GPUQ_JOB_ID"],
        env={**os.environ, **held["env"]},
        capture_output=True,
        text=True,
    )
    assert inside.stdout.split() == ["0,1", str(held["id"])]
    waiting = gpuq.submit("--gpus", "4", "true")

    # Placed or told why it waits, once the daemon has seen it: the allocation holds two of the four GPUs.
    def seen() -> dict[str, Any] | None:
        job = gpuq.job(waiting)
        return job if job["state"] != "pending" or job["reason"] else None

    shown = wait_for(seen, 30, "the daemon to place the job or say why it waits")
    assert shown["state"] == "pending", shown
    refused = gpuq.run("release-alloc", str(waiting), check=False)
    assert refused.returncode == 2 and "is not an allocation" in refused.stderr
    assert "releasing" in gpuq.run("release-alloc", str(held["id"])).stdout
    assert gpuq.wait_state(held["id"], "cancelled")["gpus"] == [0, 1]
    assert gpuq.wait_state(waiting, "succeeded")["gpus"] == [0, 1, 2, 3]


def test_gpu_memory_of_the_program_counts_as_the_jobs_not_as_outside_use(tmp_path: Path) -> None:
    gpuq = fake_cuda_queue(tmp_path, "1x80GiB")
    try:
        client = subprocess.Popen(
            [sys.executable, "-m", gpuq.entry, "run", sys.executable, "fake_cuda.py", "2", "6"],
            env=gpuq.env,
            cwd=gpuq.cwd,
        )
        gpuq.wait_state(1, "running")
        gpus = wait_for(
            lambda: (
                (g := json.loads(gpuq.run("gpus", "--json").stdout))[0]["used_outside_gpuq"] == 0 and g[0]["jobs"] and g
            ),
            20,
            "the program's memory counted as job 1's",
        )
        assert gpus[0]["jobs"] == [1]
        assert client.wait(timeout=60) == 0
        assert gpuq.wait_state(1, "succeeded")["peak_mem"] == 2 * (1 << 30) + 512 * (1 << 20)
    finally:
        gpuq.cleanup()


def test_a_notebook_kernel_installed_for_gpuq_holds_its_gpu_as_a_job_of_its_user(gpuq: Gpuq, tmp_path: Path) -> None:
    """What Jupyter does with the kernel spec: run its argv with a connection file, interrupt the kernel with
    SIGINT to its process group, shut it down with SIGTERM. ipykernel is stood in for by a module of the
    same name that reports what it was given (the real one is checked on a GPU host: see docs/reference.md)."""
    data, stub = tmp_path / "jupyter", tmp_path / "stub"
    stub.mkdir()
    (stub / "ipykernel_launcher.py").write_text(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: print('interrupted', flush=True))\n"
        "print('kernel', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUQ_JOB_ID'], sys.argv[-1], flush=True)\n"
        "while True:\n    time.sleep(0.1)\n"
    )
    env = {**gpuq.env, "JUPYTER_DATA_DIR": str(data), "PYTHONPATH": f"{stub}{os.pathsep}{gpuq.env['PYTHONPATH']}"}
    installed = subprocess.run(
        [sys.executable, "-m", gpuq.entry, "jupyter", "install-kernel", "--mem", "16G"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    spec = json.loads((data / "kernels" / "gpuq-1gpu-16g" / "kernel.json").read_text())
    assert "gpuq-1gpu-16g" in installed.stdout and spec["display_name"] == "Python (gpuq, 1 GPU, 16G each)"
    argv = [word.replace("{connection_file}", str(tmp_path / "kernel-1.json")) for word in spec["argv"]]
    kernel = subprocess.Popen(
        argv, env=env, cwd=gpuq.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert kernel.stdout is not None
    assert kernel.stdout.readline().split() == ["kernel", "0", "1", str(tmp_path / "kernel-1.json")]
    job = gpuq.job(1)
    assert (job["state"], job["name"], job["user"], job["gpus"]) == ("running", "jupyter-gpuq-1gpu-16g", _me(), [0])
    os.killpg(kernel.pid, signal.SIGINT)  # Jupyter's "interrupt the kernel"
    assert kernel.stdout.readline().strip() == "interrupted"
    os.killpg(kernel.pid, signal.SIGTERM)  # Jupyter's "shut the kernel down"
    assert kernel.wait(timeout=30) == 128 + signal.SIGTERM
    ended = gpuq.wait_state(1, "failed", "succeeded")
    assert ended["signal"] == signal.SIGTERM and ended["gpus"] == [0]


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def test_an_interactive_job_whose_gpus_do_no_work_is_warned_then_released_and_a_busy_one_is_not(
    tmp_path: Path,
) -> None:
    gpuq = fake_cuda_queue(tmp_path, "2x80GiB", GPUQ_IDLE_LIMIT="6s")
    try:
        command = [sys.executable, "-m", gpuq.entry, "run", sys.executable, "fake_cuda.py", "1"]
        idle = subprocess.Popen(
            [*command, "60", "--busy", "0"], env=gpuq.env, cwd=gpuq.cwd, stderr=subprocess.PIPE, text=True
        )
        gpuq.wait_state(1, "running")  # the idle one is job 1
        busy = subprocess.Popen([*command, "12", "--busy", "40"], env=gpuq.env, cwd=gpuq.cwd)
        shown = wait_for(lambda: [j for j in gpuq.status() if j["reason"].startswith("idle")], 30, "an idle job")
        assert [j["id"] for j in shown] == [1] and shown[0]["state"] == "running"
        _, err = idle.communicate(timeout=60)
        assert "released after 6.0s without GPU work" in err and "stopping the program" in err, err
        released = gpuq.wait_state(1, "cancelled")
        assert "did no work for" in released["reason"]
        assert busy.wait(timeout=60) == 0 and gpuq.wait_state(2, "succeeded")["state"] == "succeeded"
        assert any(e.get("event") == "idle-released" for e in map(json.loads, (gpuq.home / "events.jsonl").open()))
    finally:
        gpuq.cleanup()


def test_without_an_idle_limit_status_still_shows_how_long_an_interactive_job_was_idle(tmp_path: Path) -> None:
    """A personal queue releases nothing by default, but says after a minute how long the GPUs did no work."""
    gpuq = fake_cuda_queue(tmp_path, "1x80GiB")
    try:
        client = subprocess.Popen(
            [sys.executable, "-m", gpuq.entry, "run", sys.executable, "fake_cuda.py", "1", "600", "--busy", "0"],
            env=gpuq.env,
            cwd=gpuq.cwd,
        )
        gpuq.wait_state(1, "running")
        shown = wait_for(lambda: (j := gpuq.job(1))["reason"].startswith("idle 1m") and j, 90, "the idle time")
        assert shown["state"] == "running" and "released" not in shown["reason"]
        assert "idle 1m" in gpuq.run("status").stdout
        gpuq.run("cancel", "1")
        client.wait(timeout=60)
    finally:
        gpuq.cleanup()


def test_closing_the_terminal_hangs_up_the_program_and_ends_the_job(gpuq: Gpuq) -> None:
    term = Terminal(gpuq, "run", "--gpus", "4", "sh", "-c", "echo READY; exec sleep 300")
    term.expect("READY")
    os.close(term.master)  # the terminal window closes: the kernel hangs up its session
    assert term.proc.wait(timeout=30) == 128 + signal.SIGHUP
    ended = gpuq.wait_state(1, "failed", timeout=30)
    assert ended["signal"] == signal.SIGHUP and "SIGHUP" in ended["reason"]
    assert gpuq.wait_state(gpuq.submit("--gpus", "4", "true"), "succeeded")["gpus"] == [0, 1, 2, 3]


def test_bad_input_is_refused_in_one_line_before_anything_is_queued(gpuq: Gpuq) -> None:
    for args, words in (
        (["run", "no-such-program-here"], "command not found: no-such-program-here"),
        (["run", "--gpus", "9", "true"], "GPU"),
        (["alloc", "--json"], "give --no-shell"),
        (["run", "--time", "soon", "true"], "soon"),
    ):
        done = gpuq.run(*args, check=False)
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done
    assert gpuq.status() == []


def test_ctrl_c_while_it_runs_is_the_programs_and_gpuq_run_stays_to_report(gpuq: Gpuq) -> None:
    program = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *_: (print('GOT INT', flush=True), sys.exit(7)))\n"
        "print('READY', flush=True)\n"
        "time.sleep(60)\n"
    )
    term = Terminal(gpuq, "run", "--gpus", "1", sys.executable, "-c", program)
    term.expect("READY")
    term.type("\x03")  # Ctrl-C: the terminal signals its foreground process group
    term.expect("GOT INT")
    assert term.close() == 7
    assert gpuq.wait_state(1, "failed")["exit_code"] == 7

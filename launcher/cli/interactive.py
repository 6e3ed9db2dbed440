"""`gpuq run`, `gpuq alloc`, `gpuq release-alloc`: interactive work that takes its turn in the queue.

The queue holds the GPUs with a placeholder job (``jobs.hold``), placed, limited and recorded like any
other; the program itself runs here, in the user's own terminal (a shell, ipython, htop: no pty to relay,
window sizes and job control as usual), with the job's environment. While it waits, Ctrl-C withdraws the
job; once it runs, Ctrl-C is the program's. The placeholder ends with the program (and says how it
ended), with this process (a closed terminal, a kill -9: the GPUs are freed at once), or at the time
limit or a cancel, which end the program here too. A notebook kernel that starts through `gpuq run` is
installed by `gpuq jupyter install-kernel` (``launcher.cli.jupyter``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import click

from gpuq_scheduler.jobs.errors import BadInput, GpuqError
from gpuq_scheduler.jobs.hold import client_argv, start_ticks
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.naming import program_name
from gpuq_scheduler.jobs.outcome import JobState, signal_name
from gpuq_scheduler.launcher.cli.context import Context, JobCommand, pass_ctx

HOLD = "gpuq_scheduler.jobs.hold"
GRACE = 5.0  # seconds between SIGTERM and SIGKILL for a program whose allocation ended


def _options(command: Any) -> Any:
    for option in reversed(
        (
            click.option("--gpus", type=int, default=1, show_default=True, help="GPUs to hold (0: none, a CPU slot)."),
            click.option("--mem", help="Memory on each GPU (20G), or auto; without it, whole GPUs."),
            click.option("--name", default="", help="A name to show in status (default: the program)."),
            click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first."),
            click.option("--time", "time_limit", help="Time limit (30m, 2h); then the program is stopped."),
            click.option("--env", "env", multiple=True, metavar="K=V", help="Set an environment variable."),
            click.option("--on", "on", metavar="CLUSTER", help="On this cluster of your config: srun --pty, salloc."),
            click.option("--reservation", metavar="NAME", help="Run in this reservation of yours (`gpuq reserve`)."),
        )
    ):
        command = option(command)
    return command


def _on_cluster(tool: str, options: dict[str, Any], label: str, command: list[str]) -> None:
    """Hand the terminal to Slurm: ``srun --pty COMMAND`` or ``salloc`` (a shell on the login node whose
    ``srun``s reach the allocation), with the job shape translated as for sbatch (``jobs.slurm.sbatch``).
    Slurm keeps the record; gpuq's queue does not see these jobs."""
    from gpuq_scheduler.jobs import config
    from gpuq_scheduler.jobs.slurm import commands
    from gpuq_scheduler.jobs.slurm.sbatch import slurm_minutes
    from gpuq_scheduler.jobs.submission import env_pairs
    from gpuq_scheduler.jobs.units import parse_duration

    cluster = config.load().cluster(options["on"])
    where = f"on cluster {cluster.name}"
    if options["mem"]:
        raise BadInput(f"--mem shares a GPU by memory, which Slurm cannot do: {where} you get whole GPUs; drop --mem")
    if options["priority"] > 0:
        raise BadInput(f"--priority {options['priority']}: {where} only admins can raise a job's priority")
    argv = [commands.command(tool), f"--job-name={options['name'] or label}"]
    argv += [f"--partition={cluster.partition}"] if cluster.partition else []
    argv += [f"--account={cluster.account}"] if cluster.account else []
    argv += [f"--gres=gpu:{options['gpus']}"] if options["gpus"] else []
    limit = parse_duration(options["time_limit"]) if options["time_limit"] else cluster.time
    argv += [f"--time={slurm_minutes(limit)}"] if limit is not None else []
    argv += [f"--nice={-options['priority']}"] if options["priority"] < 0 else []
    argv += list(cluster.sbatch_flags)  # srun and salloc take sbatch's options
    if tool == "srun":
        argv += ["--pty"] if sys.stdin.isatty() else []
        argv += command
    env = {**os.environ, **env_pairs(options["env"])}
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


def _hold(ctx: Context, label: str, options: dict[str, Any], *, client: bool) -> int:
    """Queue the placeholder job and return its id."""
    from gpuq_scheduler.jobs.api import ensure_daemon, queue_job
    from gpuq_scheduler.jobs.submission import capture_spec

    argv = [sys.executable, "-m", HOLD]
    ticks = start_ticks(os.getpid())
    if client and ticks is not None:
        argv += client_argv(os.getpid(), ticks)
    spec = JobSpec.from_json(
        capture_spec(
            argv,
            environ=os.environ,
            cwd=None,
            gpus=options["gpus"],
            mem=options["mem"],
            name=options["name"] or label,
            priority=options["priority"],
            time_limit=options["time_limit"],
            mode="single",
            env=options["env"],
            reservation=options["reservation"],
        )
    )
    spec = dataclasses.replace(spec, client=os.getpid() if client else None)
    if ctx.queue.inventory() is None:  # no daemon has recorded the GPUs yet: check --gpus against them here
        from gpuq_scheduler.launcher.cli.own_jobs import check_live_inventory

        check_live_inventory(spec)
    job_id = queue_job(ctx.state, spec, patience=None)  # waits for a shared queue's daemon to give the id
    ensure_daemon(ctx.state)
    return job_id


def _wait_for_start(ctx: Context, job_id: int) -> JobRecord:
    """Wait until the job runs, with one live line on a terminal; Ctrl-C withdraws it, and so does a hang-up
    (the terminal closed) or a SIGTERM: a job whose client is gone must never start (the daemon withdraws it
    too, should this process die of a kill -9)."""
    queue, began, live = ctx.queue, time.monotonic(), sys.stderr.isatty()
    place, counted, said = 1, -float("inf"), False
    # The handlers only note the signal; the loop acts on it between steps. An exception raised by a handler
    # lands wherever the main thread happens to be (inside a read of the store, a lock's acquisition) and
    # could leave that half-done under the withdrawal that follows.
    asked: list[int] = []
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, lambda received, _: asked.append(received))
    try:
        while not asked:
            record = queue.get(job_id)
            if record.state is JobState.RUNNING:
                if live:
                    click.echo("\r\033[K", nl=False, err=True)
                elif said:
                    gpus = ",".join(map(str, record.gpus)) or "none"
                    waited = time.monotonic() - began
                    click.echo(f"gpuq: job {job_id} starts (GPUs {gpus}) after {waited:.0f}s", err=True)
                return record
            if record.state.finished:
                raise GpuqError(f"job {job_id} ended before it started: {record.state.value}: {record.reason}")
            # Off a terminal (a script, a log) one line says that it waits and why, once the daemon has said.
            tell = not live and not said and (record.reason or time.monotonic() - began >= 2.0)
            if (live or tell) and time.monotonic() - counted >= 2.0:  # reading every waiting job: not 10 times a second
                ahead, counted = (-record.spec.priority, job_id), time.monotonic()
                place = 1 + sum(
                    1
                    for r in queue.records(active_only=True)
                    if r.state is JobState.PENDING and (-r.spec.priority, r.id) < ahead
                )
            if live:
                why = record.reason or "waiting for the daemon"
                line = f"gpuq: job {job_id} waits ({place} in line, {time.monotonic() - began:.0f}s): {why}"
                click.echo(f"\r\033[K{line[:200]}", nl=False, err=True)
            elif tell:
                why = record.reason or "waiting for the daemon"
                click.echo(f"gpuq: job {job_id} waits ({place} in line): {why}", err=True)
                said = True
            time.sleep(0.1)  # a signal's handler returns into the sleep, which ends on time: 0.1 s at most
        for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)  # a second hang-up must not stop the withdrawal half-way
        queue.cancel([job_id])
        from gpuq_scheduler.jobs.api import ensure_daemon

        ensure_daemon(ctx.state)
        click.echo(("\r\033[K" if live else "") + f"gpuq: withdrew job {job_id}", err=True)
        sys.exit(128 + asked[0])  # 130 for Ctrl-C, as a shell says
    finally:
        for signum in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _given(record: JobRecord, timeout: float = 30.0) -> dict[str, Any]:
    """What the placeholder wrote first to its log: the environment gpuq gave it, and where to report."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            with open(record.log, "rb") as log:
                line = log.readline()
            if line.endswith(b"\n"):
                given: dict[str, Any] = json.loads(line)
                return given
        time.sleep(0.02)
    raise GpuqError(f"job {record.id} started but said nothing in {record.log}; see `gpuq logs {record.id}`")


def _run_held(ctx: Context, job_id: int, command: list[str], banner: str = "") -> int:
    """Run ``command`` here once job ``job_id`` holds its GPUs; report how it ended; its exit code."""
    record = _wait_for_start(ctx, job_id)
    given = _given(record)
    env = {**os.environ, **given.get("env", {})}
    if banner:
        click.echo(banner.format(job=job_id, gpus=env.get("CUDA_VISIBLE_DEVICES", "")), err=True)
    # The terminal's Ctrl-C and Ctrl-\ are the program's; we stay to report how it ended. A SIGTERM (Jupyter
    # shutting a kernel down) or a hang-up (the terminal closed) is passed on to the program, whose end we
    # then report. Handlers, not SIG_IGN, and set before the program starts: an exec keeps ignored signals
    # ignored, and a hang-up may come as soon as the program has printed its first word.
    child: subprocess.Popen[bytes] | None = None
    came: list[int] = []

    def pass_on(signum: int, frame: object) -> None:
        if signum in (signal.SIGTERM, signal.SIGHUP):
            if child is not None:
                child.send_signal(signum)
            else:
                came.append(signum)

    for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, pass_on)
    try:
        child = subprocess.Popen(command, env=env, preexec_fn=_die_with(os.getpid()))
    except OSError as err:
        _report(given, 127)
        raise BadInput(f"cannot run {command[0]}: {err.strerror}") from None
    for early in came:  # came while it was being started
        child.send_signal(early)
    ended_at, warned = None, False
    while (code := _exited(child, 0.5)) is None:
        now = ctx.queue.get(job_id)
        if not warned and "released after" in now.reason:  # the idle limit is near
            click.echo(f"\ngpuq: job {job_id}: {now.reason}", err=True)
            warned = True
        if ended_at is None and now.state.finished:  # time limit, a cancel, the idle limit
            click.echo(
                f"\ngpuq: job {job_id} ended ({now.state.value}: {now.reason or 'stopped'}); stopping the program",
                err=True,
            )
            child.terminate()
            ended_at = time.monotonic()
        elif ended_at is not None and time.monotonic() - ended_at > GRACE:
            child.kill()
    _report(given, code)
    if not sys.stderr.isatty():  # a terminal saw the program end; a script's log is told how
        ended = f"failed: exit code {code}" if code > 0 else f"killed by {signal_name(-code)}" if code else "succeeded"
        with contextlib.suppress(OSError):  # a terminal that hung up is no terminal, and takes no line either
            click.echo(f"gpuq: job {job_id} {ended}", err=True)
    return code if code >= 0 else 128 - code


def _exited(child: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _die_with(parent: int) -> Any:
    """In the child, before it runs the program: a hang-up when this process dies (a kill -9 here must not
    leave the program on GPUs the queue has already given to the next job)."""

    def arrange() -> None:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGHUP)
        if os.getppid() != parent:  # it died before the line above
            os._exit(129)

    return arrange


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _report(given: dict[str, Any], code: int) -> None:
    with contextlib.suppress(OSError, KeyError):
        fd = os.open(given["outcome"], os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, f"{code}\n".encode())
        finally:
            os.close(fd)


@click.command(cls=JobCommand, context_settings={"allow_interspersed_args": False})
@_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_ctx
def run(ctx: Context, /, command: tuple[str, ...], **options: Any) -> None:
    """Run COMMAND [ARGS]... in this terminal once the queue gives it GPUs; exit with its exit code.

    It waits its turn like any job (Ctrl-C while waiting withdraws it), then runs here with
    CUDA_VISIBLE_DEVICES and GPUQ_JOB_ID set. Its output is this terminal's, not in `gpuq logs`.
    gpuq's own options may also follow the command; everything after -- is the program's.
    """
    if options["on"]:
        _on_cluster("srun", options, program_name(command), list(command))
    if shutil.which(command[0]) is None:  # refused before anything is queued, as `gpuq submit` does
        raise BadInput(f"command not found: {command[0]}; check the name or give its full path")
    job_id = _hold(ctx, program_name(command), options, client=True)
    sys.exit(_run_held(ctx, job_id, list(command)))


@click.command()
@_options
@click.option("--no-shell", is_flag=True, help="Hold the GPUs and print their environment; release with release-alloc.")
@click.option("--json", "as_json", is_flag=True, help="With --no-shell: print the allocation as JSON.")
@pass_ctx
def alloc(ctx: Context, /, no_shell: bool, as_json: bool, **options: Any) -> None:
    """Hold GPUs and start a shell that sees them: everything started in it (jupyter lab too) uses them.
    Leaving the shell, or the time limit, releases them."""
    if as_json and not no_shell:
        raise BadInput("--json prints an allocation for tools: give --no-shell too")
    if options["on"]:
        if no_shell:
            raise BadInput(f"--no-shell --on {options['on']}: Slurm keeps that allocation; use `salloc --no-shell`")
        _on_cluster("salloc", options, "alloc", [])
    if not no_shell:
        shell = os.environ.get("SHELL") or "/bin/sh"
        job_id = _hold(ctx, "alloc", options, client=True)
        banner = "gpuq: job {job} holds GPUs [{gpus}] until you leave this shell"
        sys.exit(_run_held(ctx, job_id, [shell], banner=banner))
    job_id = _hold(ctx, "alloc", options, client=False)
    env = _given(_wait_for_start(ctx, job_id)).get("env", {})
    if as_json:
        click.echo(json.dumps({"id": job_id, "env": env}))
    else:
        click.echo("".join(f"export {key}={shlex.quote(value)}\n" for key, value in sorted(env.items())), nl=False)
        click.echo(f"# gpuq: job {job_id} holds these GPUs until `gpuq release-alloc {job_id}`", err=True)


@click.command("release-alloc")
@click.argument("job_id", type=int)
@pass_ctx
def release_alloc(ctx: Context, job_id: int) -> None:
    """Give back the GPUs an allocation (`gpuq alloc --no-shell`) holds."""
    from gpuq_scheduler.jobs.api import ensure_daemon

    record = ctx.queue.details(job_id)  # the command, which a shared queue shows its owner alone
    if HOLD not in record.spec.command:
        raise BadInput(f"job {job_id} is not an allocation; `gpuq cancel {job_id}` stops a job")
    if record.state.finished:
        click.echo(f"job {job_id} already ended ({record.state.value})")
        return
    ctx.queue.cancel([job_id])
    ensure_daemon(ctx.state)
    click.echo(f"releasing job {job_id}")

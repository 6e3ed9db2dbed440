"""`gpuq submit, show, logs, wait`: a user's own jobs (`gpuq status` is ``launcher.cli.status``; cancel, hold,
release and update are ``launcher.cli.acting``)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpuq_scheduler.jobs.errors import BadInput, NotPermitted, UnknownJob
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.options import SUBMIT
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.rules import MODES
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.launcher.cli.context import FROM_SCRIPT, NUMBER, Context, SubmitCommand, pass_ctx


def submit_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Submit's click options, built from their one declaration (``jobs.options``), in its order."""
    types = {"int": NUMBER, "str": None, "mode": click.Choice(MODES), "dir": click.Path(file_okay=False)}
    for option in reversed(SUBMIT):
        settings: dict[str, Any] = {"default": option.default, "help": option.help, "metavar": option.metavar}
        if option.show_default:
            settings["show_default"] = True
        if option.kind == "flag":
            settings["is_flag"] = True
        elif option.kind == "list":
            settings["multiple"] = True
        else:
            settings["type"] = types[option.kind]
        command = click.option(option.flag, option.dest, **settings)(command)
    return command


@click.command(cls=SubmitCommand, context_settings={"allow_interspersed_args": False})
@submit_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@pass_ctx
def submit(ctx: Context, /, command: tuple[str, ...], **options: Any) -> None:
    """Queue COMMAND [ARGS]... to run when GPUs are free. A *.py command runs with your current python.

    gpuq's own options may come before or after the command; everything after -- is the job's. A job
    option that shares a name with one of gpuq's goes after --:

    \b
        gpuq submit train.py --gpus 2              # 2 GPUs; the job's argv: train.py
        gpuq submit train.py --gpus 2 -- --gpus 4  # 2 GPUs; argv: train.py --gpus 4
        gpuq submit train.py --lr 0.1              # options gpuq lacks are the job's

    In an array, {index} in the command becomes each member's index (also in $GPUQ_ARRAY_INDEX).
    """
    from gpuq_scheduler.jobs.api import ensure_daemon, queue_job
    from gpuq_scheduler.jobs.arrays import parse_arrays
    from gpuq_scheduler.jobs.errors import NoIdYet
    from gpuq_scheduler.jobs.store.outbox import ANSWER_PATIENCE
    from gpuq_scheduler.jobs.store.spool import ArrayPlan
    from gpuq_scheduler.jobs.submission import capture_spec, parse_ids

    # launcher.cli.submit runs most submits without click, through the same capture_spec.
    indices, throttle, sweep = parse_arrays(options["array_spec"])
    plan = ArrayPlan(indices, throttle) if indices else None
    given = {option.dest: options[option.dest] for option in SUBMIT if option.spec}
    after, after_any, like, on = options["after"], options["after_any"], options["like"], options["on"]
    given["after"] = parse_ids(after) if after else ()
    from_script = click.get_current_context().meta.get(FROM_SCRIPT, [])
    spec = JobSpec.from_json(
        capture_spec(command, environ=os.environ, sweep=sweep, array=plan is not None, from_script=from_script, **given)
    )
    if like is not None and on is None:
        try:
            ctx.queue.get(like)
        except UnknownJob:
            raise BadInput(f"--like {like}: no job {like} here to learn from (see `gpuq status --all`)") from None
    if sweep and on is not None:
        raise BadInput(f"--array {sweep[0][0]}=...: named values run on this machine's queue; --on takes indices")
    if after_any and not after:
        raise BadInput("--after-any says how to read --after: give --after IDS too")
    if on is None and ctx.queue.inventory() is None:
        check_live_inventory(spec)
    try:  # --wait waits for the daemon's answer too, however long it takes (a shared queue's daemon gives ids)
        job_id = queue_job(ctx.state, spec, plan, on=on, patience=None if options["wait_"] else ANSWER_PATIENCE)
    except NoIdYet as queued:
        click.echo(f"gpuq: {queued}", err=True)  # not an id that may prove untrue: the job is safe all the same
        return
    if on is None:
        ensure_daemon(ctx.state)
    members = list(plan.member_ids(job_id)) if plan else [job_id]
    if options["as_json"]:
        click.echo(json.dumps({"id": job_id, "jobs": members} if plan else {"id": job_id}))
    elif plan:
        click.echo(f"submitted array {job_id} ({len(members)} jobs, {members[0]}-{members[-1]})")
    else:
        click.echo(f"submitted job {job_id}" + (f" to {on}" if on else ""))
    if options["wait_"]:
        records = _wait(ctx, members)
        click.echo(closing_line(records), err=True)  # as `gpuq wait` ends: how it ended, and why if it failed
        sys.exit(_exit_code(records[0]) if not plan else int(any(r.state is not JobState.SUCCEEDED for r in records)))


def check_live_inventory(spec: JobSpec) -> None:
    """No daemon has recorded the GPUs here yet: look at them ourselves (once per state directory)."""
    from gpuq_scheduler.jobs.submission import Inventory
    from gpuq_scheduler.launcher.gpus.sources import open_source

    source = open_source()
    try:
        Inventory(tuple(g.total for g in source.snapshot())).check(spec)
    finally:
        source.close()


@click.command()
@click.argument("job_id", type=NUMBER)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def show(ctx: Context, job_id: int, as_json: bool) -> None:
    """Everything gpuq knows about one job; for an array, its members, one line each."""
    from gpuq_scheduler.launcher.views import daemon_health
    from gpuq_scheduler.launcher.views.live import with_host_usage
    from gpuq_scheduler.launcher.views.tables import array_view
    from gpuq_scheduler.launcher.views.tables import show as show_view

    down = daemon_health.daemon_down(ctx.state)
    # said once the job is found: an error is one line
    said = "" if as_json else daemon_health.queue_line(ctx.state, down)
    queue = ctx.jobs()
    members = _members(queue, job_id)
    if members:
        name = queue.array_names().get(job_id) or members[0].spec.display_name
        if as_json:
            click.echo(json.dumps({"array": job_id, "name": name, "jobs": [r.to_json() for r in members]}, indent=1))
        else:
            click.echo(said, err=True)
            click.echo(array_view(job_id, name, members, down=down))
        return
    from gpuq_scheduler.launcher.views import suspend_costs

    record = with_host_usage(ctx.state, queue.details(job_id))
    if said:
        click.echo(said, err=True)
    moved = suspend_costs.of_job(record, suspend_costs.read(ctx.state.events, record.id), time.time())
    if as_json:
        counts = {
            "preemptions": moved.preemptions,
            "requeues": moved.requeues,
            "suspends": moved.suspends,
            "bytes_moved": moved.bytes,
            "last_suspend_path": moved.last[0].value if moved.last else None,
            "last_suspend_fallback": moved.last[1].value if moved.last and moved.last[1] else None,
        }
        click.echo(json.dumps({**record.to_json(), **counts}, indent=1))
    else:
        click.echo(show_view(record, moved=moved.text(), down=down))


def _members(queue: Queue, job_id: int) -> list[JobRecord]:
    """The members of array ``job_id`` (its id stands for them all), or [] if it is a job's id."""
    records = queue.resolve([job_id])
    return records if records and records[0].array_id == job_id and records[0].id != job_id else []


@click.command()
@click.argument("job_id", type=NUMBER)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@pass_ctx
def logs(ctx: Context, job_id: int, follow: bool) -> None:
    """Print a job's output (stdout and stderr); for an array, each member's, under a line naming it."""
    queue = ctx.jobs()
    members = _members(queue, job_id)
    ids = [r.id for r in members] if members else [job_id]
    records = {r.id: r for r in members} if members else {job_id: queue.get(job_id)}
    offsets = dict.fromkeys(ids, 0)
    last: int | None = None
    while True:
        running = [i for i in ids if not records[i].state.finished] if follow else []
        for member in ids:
            offset = offsets[member]
            title = f"==> job {member} (index {records[member].array_index}) <==\n" if members else ""
            offsets[member] = _copy_from(Path(records[member].log), offset, title if member != last else "")
            if offsets[member] != offset:
                last = member
        if not running:
            return
        time.sleep(0.1)
        for member in running:
            records[member] = queue.get(member)


def _copy_from(path: Path, offset: int, title: str = "") -> int:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return offset
    except PermissionError:
        raise NotPermitted(f"{path} is readable by its job's owner and the queue's admins only") from None
    if data and title:  # an array's logs, one after another: say whose this is
        sys.stdout.buffer.write(title.encode())
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    return offset + len(data)


@click.command("wait")
@click.argument("job_ids", type=NUMBER, nargs=-1)
@click.option("--array", "arrays", type=NUMBER, multiple=True, help="Wait for every member of this array.")
@pass_ctx
def wait_command(ctx: Context, job_ids: tuple[int, ...], arrays: tuple[int, ...]) -> None:
    """Block until these jobs or arrays (default: all active jobs) end. Exit 0 only if all succeeded.

    On a terminal it shows progress (done, failed, running, ETA). At the end it says how they ended
    ("8 succeeded", "2 failed: job 7 ..."), on a terminal or not.
    """
    wanted = [*job_ids, *arrays]
    records = _wait(ctx, [r.id for r in ctx.jobs().resolve(wanted)] if wanted else None)
    failed = [r for r in records if r.state is not JobState.SUCCEEDED]
    from gpuq_scheduler.jobs.shown import shown

    for record in failed[:20]:
        click.echo(f"job {record.id} {record.state.value}: {shown(record.reason) or record.exit_code}", err=True)
    if len(failed) > 20:
        click.echo(f"... and {len(failed) - 20} more did not succeed (`gpuq status --expand`)", err=True)
    click.echo(closing_line(records), err=True)
    sys.exit(1 if failed else 0)


def closing_line(records: list[JobRecord]) -> str:
    """How the jobs waited for ended, in one line: "8 succeeded", or "6 succeeded, 2 failed: job 7 failed:
    RuntimeError: loss is NaN" (the first that did not succeed, and why)."""
    if not records:
        return "gpuq: no jobs to wait for"
    counts = {state.value: 0 for state in JobState}  # succeeded first, then the ways not to succeed
    for record in records:
        counts[record.state.value] += 1
    line = "gpuq: " + ", ".join(f"{count} {state}" for state, count in counts.items() if count)
    first = next((r for r in records if r.state is not JobState.SUCCEEDED), None)
    if first is not None:
        line += f": job {first.id} {first.state.value}: {first.reason or f'exit code {first.exit_code}'}"
    return line


def _wait(ctx: Context, job_ids: list[int] | None) -> list[JobRecord]:
    from gpuq_scheduler.jobs.api import wait
    from gpuq_scheduler.launcher.views.tables import Progress

    progress = Progress(sys.stderr) if sys.stderr.isatty() else None
    records = wait(job_ids, home=ctx.state.root, on_progress=progress)
    if progress is not None:
        progress.close()
    return records


def _exit_code(record: JobRecord) -> int:
    if record.exit_code is not None:
        return record.exit_code
    if record.signal is not None:
        return 128 + record.signal
    return 0 if record.state is JobState.SUCCEEDED else 1

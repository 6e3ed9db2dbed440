"""`gpuq cancel, hold, release, update`: acting on one's jobs, named by id or chosen by name, state and user
(``launcher.cli.select``). Owner, the queue's owner or an admin only; the daemon checks each request again."""

from __future__ import annotations

import click

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.selection import Selection
from gpuq_scheduler.jobs.selection import parse as parse_selection
from gpuq_scheduler.jobs.store.action_values import Update
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.launcher.cli.context import NUMBER, Context, pass_ctx
from gpuq_scheduler.launcher.cli.own_jobs import _members
from gpuq_scheduler.launcher.cli.select import JOB_ID, chosen, listed, need_some, nothing, selection_options


@click.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@selection_options
@click.option("--all", "everything", is_flag=True, help="All your active jobs (as `scancel -u $USER`).")
@pass_ctx
def cancel(
    ctx: Context, job_ids: tuple[int, ...], name: str | None, state: str | None, user: str | None, everything: bool
) -> None:
    """Stop jobs: pending ones never start, running ones get SIGTERM then SIGKILL. Owner or admin only.

    \b
        gpuq cancel 17 18               # these jobs (an array's id: all its members)
        gpuq cancel --name 'seed*'      # your active jobs whose name matches
        gpuq cancel --state pending     # your jobs that have not started
        gpuq cancel --all               # all your active jobs
    """
    from gpuq_scheduler.jobs.api import ensure_daemon, local_ids

    selection = parse_selection(name, state, user, everything=everything, allowed=ACTIVE)
    need_some("cancel", job_ids, selection, all_option=True)
    queue = ctx.jobs()
    if selection.given:
        records = chosen(ctx, "cancel", selection, job_ids, ACTIVE)
        if not records:
            click.echo(nothing("cancel", selection, job_ids, "active"))
            return
        active = queue.cancel([r.id for r in records])
        if local_ids(ctx.state, active):
            ensure_daemon(ctx.state)
        click.echo(f"cancelling {len(active)} job(s) chosen by {selection.words()}: {listed(active)}")
        return
    active = queue.cancel(job_ids)
    if local_ids(ctx.state, active):  # cluster jobs were cancelled with scancel: no daemon needed for them
        ensure_daemon(ctx.state)
    for job_id in job_ids:
        named = [] if job_id in active else _members(queue, job_id)
        members = [r.id for r in named if r.id in active]
        if members:
            click.echo(f"cancelling array {job_id} ({len(members)} active job(s))")
        else:
            what = "array" if named else "job"
            click.echo(f"cancelling job {job_id}" if job_id in active else f"{what} {job_id} has already ended")


ACTIVE = (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)


@click.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@selection_options
@pass_ctx
def hold(ctx: Context, job_ids: tuple[int, ...], name: str | None, state: str | None, user: str | None) -> None:
    """Keep pending jobs (or an array's pending members) from starting until released; without ids, your
    pending jobs chosen by --name, --state or --user."""
    _chosen_control(ctx, Action.HOLD, job_ids, parse_selection(name, state, user, allowed=(JobState.PENDING,)))


@click.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@selection_options
@pass_ctx
def release(ctx: Context, job_ids: tuple[int, ...], name: str | None, state: str | None, user: str | None) -> None:
    """Let held jobs (or a held array) run again; without ids, your held jobs chosen by --name or --user."""
    _chosen_control(ctx, Action.RELEASE, job_ids, parse_selection(name, state, user, allowed=(JobState.PENDING,)))


def _chosen_control(ctx: Context, action: Action, job_ids: tuple[int, ...], selection: Selection) -> None:
    """hold or release the jobs named, or chosen by ``selection`` among the pending ones (held ones, to release)."""
    need_some(action, job_ids, selection)
    if not selection.given:
        _control(ctx, action, job_ids)
        return
    records = chosen(ctx, action, selection, job_ids, (JobState.PENDING,), held=action == "release")
    if not records:
        click.echo(nothing(action, selection, job_ids, "held" if action == "release" else "pending"))
        return
    pending = _control(ctx, action, tuple(r.id for r in records), said=False)
    done = "held" if action == "hold" else "released"
    click.echo(f"{done} {len(pending)} pending job(s) chosen by {selection.words()}: {listed([r.id for r in pending])}")


@click.command()
@click.argument("job_ids", type=NUMBER, nargs=-1, required=True)
@click.option("--priority", type=NUMBER, help="New priority (higher runs first).")
@click.option("--time", "time_limit", help="New time limit (90s, 30m, 2h...).")
@pass_ctx
def update(ctx: Context, job_ids: tuple[int, ...], priority: int | None, time_limit: str | None) -> None:
    """Change a pending job's (or array's) priority or time limit."""
    from gpuq_scheduler.jobs.rules import check_update
    from gpuq_scheduler.jobs.units import parse_duration

    seconds = None if time_limit is None else parse_duration(time_limit)
    check_update(priority, seconds)
    if priority is None and seconds is None:
        raise BadInput("nothing to update: give --priority P and/or --time DURATION")
    _control(ctx, Action.UPDATE, job_ids, Update(priority, seconds))


def _control(
    ctx: Context, action: Action, job_ids: tuple[int, ...], values: Update | None = None, said: bool = True
) -> list[JobRecord]:
    from gpuq_scheduler.jobs.api import ensure_daemon

    pending = ctx.queue.control(action, job_ids, values)
    if pending:
        ensure_daemon(ctx.state)
    done = {Action.HOLD: "held", Action.RELEASE: "released", Action.UPDATE: "updated"}[action]
    if said:
        click.echo(
            f"{done} {len(pending)} pending job(s): {listed([r.id for r in pending])}"
            if pending
            else f"nothing to {action}: no pending job among those"
        )
    return pending

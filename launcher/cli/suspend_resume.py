"""`gpuq suspend, resume`: move a running job's GPU state to host memory and back (docs/suspend.md).

click's commands for help, usage errors and --debug; what they do is ``launcher.cli.suspend.act``, which the
quick path (no click) runs too."""

from __future__ import annotations

import click

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.selection import Selection
from gpuq_scheduler.jobs.selection import parse as parse_selection
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.launcher.cli.context import Context, pass_ctx
from gpuq_scheduler.launcher.cli.select import JOB_ID, chosen, listed, need_some, nothing, selection_options
from gpuq_scheduler.launcher.cli.suspend import act


@click.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@selection_options
@pass_ctx
def suspend(ctx: Context, job_ids: tuple[int, ...], name: str | None, state: str | None, user: str | None) -> None:
    """Suspend running jobs: their GPU state moves to host memory and their GPUs go back to the pool, until
    `gpuq resume`. Owner, the queue's owner or an admin only. Without ids: your running jobs chosen by
    --name or --user."""
    selection = parse_selection(name, state, user, allowed=(JobState.RUNNING,))
    need_some("suspend", job_ids, selection)
    _act(ctx, Action.SUSPEND, job_ids, selection, JobState.RUNNING)


@click.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@selection_options
@pass_ctx
def resume(ctx: Context, job_ids: tuple[int, ...], name: str | None, state: str | None, user: str | None) -> None:
    """Resume suspended jobs on the GPUs they left, once those are free; without ids, your suspended jobs
    chosen by --name or --user. (`gpuq unpause` lets a paused queue start jobs again; `gpuq undrain GPU`
    places jobs on a drained GPU again.)"""
    selection = parse_selection(name, state, user, allowed=(JobState.SUSPENDED,))
    if not job_ids and not selection.given:
        raise BadInput(
            "`gpuq resume JOB_ID...` resumes suspended jobs (or --name GLOB, --user NAME chooses them); "
            "to let a paused queue start jobs, type `gpuq unpause`"
        )
    _act(ctx, Action.RESUME, job_ids, selection, JobState.SUSPENDED)


def _act(ctx: Context, action: Action, job_ids: tuple[int, ...], selection: Selection, among: JobState) -> None:
    if not selection.given:
        act(ctx.state, action, job_ids)
        return
    records = chosen(ctx, action, selection, job_ids, (among,))
    if not records:
        click.echo(nothing(action, selection, job_ids, among.value))
        return
    ids = [r.id for r in records]
    act(ctx.state, action, ids)
    click.echo(f"{len(ids)} job(s) chosen by {selection.words()}: {listed(ids)}")

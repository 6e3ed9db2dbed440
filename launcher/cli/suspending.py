"""`gpuq suspend, resume`: move a running job's GPU state to host memory and back (docs/suspend.md)."""

from __future__ import annotations

import click

from gpuq_scheduler.jobs.errors import BadInput, UnknownJob
from gpuq_scheduler.launcher.cli.context import NUMBER, Context, pass_ctx


@click.command()
@click.argument("job_ids", type=NUMBER, nargs=-1, required=True)
@pass_ctx
def suspend(ctx: Context, job_ids: tuple[int, ...]) -> None:
    """Suspend running jobs: their GPU state moves to host memory and their GPUs go back to the pool, until
    `gpuq resume`. Owner, the queue's owner or an admin only."""
    _act(ctx, "suspend", job_ids)


@click.command()
@click.argument("job_ids", type=NUMBER, nargs=-1)
@pass_ctx
def resume(ctx: Context, job_ids: tuple[int, ...]) -> None:
    """Resume suspended jobs on the GPUs they left, once those are free. (`gpuq unpause` lets a paused queue
    start jobs again; `gpuq undrain GPU` places jobs on a drained GPU again.)"""
    if not job_ids:
        raise BadInput(
            "`gpuq resume JOB_ID...` resumes suspended jobs; to let a paused queue start jobs, type `gpuq unpause`"
        )
    _act(ctx, "resume", job_ids)


def _act(ctx: Context, action: str, job_ids: tuple[int, ...]) -> None:
    from gpuq_scheduler.jobs.api import ensure_daemon

    queue = ctx.jobs()
    try:
        chosen = queue.suspend(action, job_ids)
    except (BadInput, UnknownJob):
        if action == "resume":
            _old_spelling(ctx, job_ids)
        raise
    ensure_daemon(ctx.state)
    for record in chosen:
        click.echo(f"{'suspending' if action == 'suspend' else 'resuming'} job {record.id}")


def _old_spelling(ctx: Context, ids: tuple[int, ...]) -> None:
    """`gpuq resume GPU...` undrained GPUs before `resume` was a job's word: ids that name no suspended job
    but are all GPUs here are taken for that, and the error says what to type."""
    inventory = ctx.jobs().inventory()
    if inventory is not None and all(0 <= i < len(inventory.totals) for i in ids):
        listed = " ".join(map(str, ids))
        raise BadInput(
            f"`gpuq resume` takes suspended jobs' ids; to place jobs on GPU(s) {listed} again, "
            f"type `gpuq undrain {listed}`"
        )

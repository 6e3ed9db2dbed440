"""`gpuq suspend, resume`: move a running job's GPU state to host memory and back (docs/suspend.md).

click's commands for help, usage errors and --debug; what they do is ``launcher.cli.suspend.act``, which the
quick path (no click) runs too."""

from __future__ import annotations

import click

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.launcher.cli.context import NUMBER, Context, pass_ctx
from gpuq_scheduler.launcher.cli.suspend import act


@click.command()
@click.argument("job_ids", type=NUMBER, nargs=-1, required=True)
@pass_ctx
def suspend(ctx: Context, job_ids: tuple[int, ...]) -> None:
    """Suspend running jobs: their GPU state moves to host memory and their GPUs go back to the pool, until
    `gpuq resume`. Owner, the queue's owner or an admin only."""
    act(ctx.state, "suspend", job_ids)


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
    act(ctx.state, "resume", job_ids)

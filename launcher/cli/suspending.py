"""`gpuq suspend, resume`: move a running job's GPU state to host memory and back (docs/suspend.md)."""

from __future__ import annotations

import functools

import click

from gpuq_scheduler.jobs.errors import BadInput, UnknownJob
from gpuq_scheduler.jobs.model import JobRecord
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
        check = functools.partial(_refuse_mps_clients, ctx) if action == "suspend" else None
        chosen = queue.suspend(action, job_ids, refuse=check)
    except (BadInput, UnknownJob):
        if action == "resume":
            _old_spelling(ctx, job_ids)
        raise
    ensure_daemon(ctx.state)
    for record in chosen:
        click.echo(f"{'suspending' if action == 'suspend' else 'resuming'} job {record.id}")


def _refuse_mps_clients(ctx: Context, chosen: list[JobRecord]) -> None:
    """A packed one-GPU job on a queue whose fence is MPS runs as a client of an MPS server, whose lock the
    driver refuses (801): said here, in one line, before anything is asked (the daemon checks it too)."""
    import json

    try:
        with open(ctx.state.inventory, "rb") as handle:
            fences = {gpu["index"]: gpu.get("fence") for gpu in json.load(handle)["gpus"]}
    except (OSError, ValueError, KeyError, TypeError):
        return
    for record in chosen:
        spec = record.spec
        if spec.mem_per_gpu is not None and spec.gpus == 1 and all(fences.get(g) == "mps" for g in record.gpus):
            raise BadInput(
                f"job {record.id} runs as a client of an MPS server (packed with --mem under the MPS fence), which "
                "the driver cannot checkpoint; it cannot be suspended"
            )


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

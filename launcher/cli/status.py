"""`gpuq status`: what is queued, running and recently done, which GPUs each job got, and the notes a user
should see beside the table (the daemon down, reservations, requests set aside)."""

from __future__ import annotations

import json
import os

import click

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.selection import Selection
from gpuq_scheduler.jobs.selection import parse as parse_selection
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.launcher.cli.context import Context, pass_ctx
from gpuq_scheduler.launcher.cli.select import selection_options


@click.command()
@click.argument("job_ids", type=int, nargs=-1)
@click.option("-j", "--jobs", "listed", multiple=True, metavar="IDS", help="Jobs or arrays 1,2,...")
@click.option("--all", "show_all", is_flag=True, help="Every job ever run here, not just active and recent ones.")
@selection_options
@click.option("--me", is_flag=True, help="Only your jobs (--user you).")
@click.option("--expand", is_flag=True, help="One line per array member instead of one per array.")
@click.option(
    "--format",
    "columns",
    metavar="COLUMNS",
    help="These columns, one line per job: id,name,state,gpus,"
    "runtime,peak_mem,gpu_hours,energy,... (default: [status] format in your config, if set).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of job objects.")
@pass_ctx
def status(
    ctx: Context,
    job_ids: tuple[int, ...],
    listed: tuple[str, ...],
    show_all: bool,
    name: str | None,
    state: str | None,
    user: str | None,
    me: bool,
    expand: bool,
    columns: str | None,
    as_json: bool,
) -> None:
    """What is queued, running and recently done, and which GPUs each job got. Given job or array ids
    (`gpuq status 3 7`, `gpuq status -j 3,7`): those jobs only. --name, --state, --user and --me choose
    among them (with --all, among every job ever run here)."""
    from gpuq_scheduler.jobs.listing import Line
    from gpuq_scheduler.jobs.submission import parse_ids
    from gpuq_scheduler.launcher.cli.select import me as my_name
    from gpuq_scheduler.launcher.views import daemon_health
    from gpuq_scheduler.launcher.views import reservation_lines as reserved
    from gpuq_scheduler.launcher.views.tables import fold_arrays, many_rows, status_table

    if me and user is not None:
        raise BadInput("--me is --user you: give one of them")
    selection = parse_selection(name, state, my_name() if me else user)
    picked = None if as_json else _columns(columns)
    wanted = [*job_ids, *(i for text in listed for i in parse_ids(text, option="-j"))]
    queue = ctx.jobs()
    down = daemon_health.daemon_down(ctx.state)
    with many_rows():
        chosen_records = queue.resolve(wanted) if wanted else None  # an unknown id's error is one line: first
        if not as_json:  # first: which queue this is, and whether its daemon runs (stderr: the table stays a table)
            click.echo(daemon_health.queue_line(ctx.state, down), err=True)
            for line in [reserved.status_line(ctx.state), *reserved.outside_lines(ctx.state)]:
                if line:  # reservations now or to come; GPU memory held outside gpuq, named
                    click.echo(line, err=True)
        if as_json or picked is not None:
            records = (
                chosen_records
                if chosen_records is not None
                else queue.records()
                if show_all
                else _active_and_recent(queue)
            )
            if selection.given:
                records = [r for r in records if selection.matches(r.spec.display_name, r.user, r.state)]
            if picked is None:
                click.echo(json.dumps([r.to_json() for r in records], indent=1))
            elif records:
                from gpuq_scheduler.launcher.views import columns as listing

                click.echo(listing.table(records, picked))
            else:
                click.echo(_none(selection, show_all or bool(wanted)))
        else:
            # --all reads a listing's few fields straight from the table: no record is built per job.
            if chosen_records is not None:
                lines = [Line.of(r) for r in chosen_records]
            else:
                lines = queue.lines() if show_all else [Line.of(r) for r in _active_and_recent(queue)]
            if selection.given:
                lines = [line for line in lines if selection.matches(line.name, line.user, line.state)]
            if lines:
                names = queue.array_names()
                click.echo(status_table(lines, down=down) if expand else fold_arrays(lines, names, down=down))
            else:
                click.echo(_none(selection, show_all or bool(wanted)))
    rejected = ctx.queue.rejected()
    if rejected and not as_json:
        click.echo(
            f"note: {rejected} request file(s) could not be read and were set aside in {ctx.state.rejected}"
            " (each has a .why file beside it)",
            err=True,
        )
    for note in getattr(queue, "notes", []):  # a cluster that did not answer
        click.echo(f"note: {note}", err=True)
    if not as_json:
        failing = daemon_health.failing_pass(ctx.state)
        mine = [*daemon_health.set_aside(ctx.state, os.getuid()), *reserved.notes(ctx.state, os.getuid())]
        for note in [*([failing] if failing else []), *mine]:
            click.echo(f"note: {note}", err=True)


def _columns(given: str | None) -> tuple[str, ...] | None:
    """The columns --format picks, else the config's [status] format, else None: the usual table."""
    from gpuq_scheduler.jobs import config

    if given is None:
        default = config.load().status
        if default.format is None:
            return None
        given, where = default.format, f"{default.source}: status.format"
    else:
        where = "--format"
    from gpuq_scheduler.launcher.views import columns

    return columns.parse(given, where)


def _none(selection: Selection, everything: bool) -> str:
    """What `gpuq status` says when it lists no job."""
    if selection.given:
        return f"no job matches {selection.words()}" + (
            "" if everything else " (`--all`: among every job ever run here)"
        )
    return "no jobs" + ("" if everything else " active or recent (`gpuq status --all` shows every job)")


def _active_and_recent(queue: Queue, recent: int = 20) -> list[JobRecord]:
    """Active jobs, the last few finished ones, and every member of any array among them."""
    active = queue.records(active_only=True)
    done = [r for r in queue.records(limit=recent + len(active)) if r.state.finished][-recent:]
    chosen = {r.id: r for r in [*done, *active]}
    arrays = {r.array_id for r in chosen.values() if r.array_id is not None}
    chosen.update((r.id, r) for r in queue.resolve(arrays))
    return sorted(chosen.values(), key=lambda r: r.id)

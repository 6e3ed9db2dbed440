"""`gpuq gpus, top, serve, drain, undrain, pause, unpause, report, doctor`: the machine and the queue as a whole."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from gpuq_scheduler.jobs.errors import GpuqError
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.launcher.cli.context import Context, pass_ctx


@click.command()
@click.argument("gpu_ids", type=int, nargs=-1, required=True)
@pass_ctx
def drain(ctx: Context, gpu_ids: tuple[int, ...]) -> None:
    """Place nothing new on these GPUs; jobs running there finish. `gpuq undrain GPU` undoes it."""
    _queue_control(ctx, Action.DRAIN, gpu_ids, f"draining GPU(s) {', '.join(map(str, gpu_ids))}")


@click.command()
@pass_ctx
def pause(ctx: Context) -> None:
    """Start nothing new anywhere; running jobs finish. `gpuq unpause` undoes it."""
    _queue_control(ctx, Action.PAUSE, (), "queue paused: nothing new starts until `gpuq unpause`")


@click.command()
@click.argument("gpu_ids", type=int, nargs=-1, required=True)
@pass_ctx
def undrain(ctx: Context, gpu_ids: tuple[int, ...]) -> None:
    """Place jobs on drained GPUs again."""
    _queue_control(ctx, Action.UNDRAIN, gpu_ids, f"GPU(s) {', '.join(map(str, gpu_ids))} in use again")


@click.command()
@pass_ctx
def unpause(ctx: Context) -> None:
    """Let a paused queue start jobs again."""
    _queue_control(ctx, Action.UNPAUSE, (), "queue unpaused")


def _queue_control(ctx: Context, action: Action, gpu_ids: tuple[int, ...], message: str) -> None:
    from gpuq_scheduler.jobs.api import ensure_daemon

    ctx.queue.control_queue(action, gpu_ids)
    ensure_daemon(ctx.state)
    click.echo(message)


@click.command()
@click.option("--since", default="12h", show_default=True, help="How far back to look: 90m, 12h, 2d, 01:30:00.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report as one standalone HTML page, with a per-GPU timeline.",
)
@pass_ctx
def report(ctx: Context, since: str, html_file: Path | None) -> None:
    """The morning report: outcomes, GPU-hours by user and array, idle GPUs while work waited, a timeline."""
    from gpuq_scheduler.jobs.units import parse_duration
    from gpuq_scheduler.launcher.policy.placement import Policy
    from gpuq_scheduler.launcher.views import suspend_costs
    from gpuq_scheduler.launcher.views.report import build_report
    from gpuq_scheduler.launcher.views.report_html import render_html
    from gpuq_scheduler.launcher.views.report_text import render_text

    window = parse_duration(since)
    inventory = ctx.queue.inventory()
    queue = ctx.jobs()
    records = queue.records()
    totals = inventory.totals if inventory else ()
    result = build_report(
        records,
        len(totals),
        now=time.time(),
        since=window,
        totals=totals,
        overhead=Policy().overhead,
        array_names=queue.array_names(),
        moves=suspend_costs.read(ctx.state.events),
    )
    click.echo(render_text(result))
    if html_file is not None:
        html_file.write_text(render_html(result), encoding="utf-8")
        click.echo(f"wrote {html_file}")


@click.command()
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def gpus(ctx: Context, as_json: bool) -> None:
    """Every GPU: total, used outside gpuq, reserved by gpuq jobs, free, and the jobs holding it."""
    from gpuq_scheduler.launcher.gpus import holders
    from gpuq_scheduler.launcher.gpus.sources import open_source
    from gpuq_scheduler.launcher.views import live
    from gpuq_scheduler.launcher.views.doctor import containment
    from gpuq_scheduler.launcher.views.gpu_rows import gpu_table

    source = open_source()
    try:
        picture = live.take(ctx.queue, source)
    finally:
        source.close()
    rows = [line.row for line in picture.gpus]
    if as_json:  # each GPU's row, with who holds its memory outside gpuq
        shown = [
            {**row.to_json(), "outside": [h.to_json() for h in picture.outside if h.gpu == row.index]} for row in rows
        ]
        click.echo(json.dumps(shown, indent=1))
    else:
        click.echo(gpu_table(rows) if rows else "no GPUs found (set GPUQ_FAKE_GPUS=4x80GiB to try gpuq without any)")
        for line in holders.lines(picture.outside):  # who holds the OUTSIDE column's memory
            click.echo(line)
        click.echo(containment(ctx.state))


@click.command()
@click.option(
    "--interval", type=click.FloatRange(0.2, 60), default=1.0, show_default=True, help="Seconds between redraws."
)
@click.option("--mine", is_flag=True, help="Only my jobs (the GPUs are shown whole).")
@pass_ctx
def top(ctx: Context, interval: float, mine: bool) -> None:
    """A live view: GPUs (memory by holder, utilisation, fence), running and waiting jobs; keys to act."""
    try:
        from gpuq_scheduler.launcher.views import top as live_top
    except ImportError as err:  # textual is the optional `top` extra
        raise GpuqError(f"gpuq top needs textual ({err.name} is missing): pip install 'gpuq-scheduler[top]'") from None
    live_top.run(ctx.jobs(), interval, mine)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8470, show_default=True, help="0: any free port.")
@pass_ctx
def serve(ctx: Context, host: str, port: int) -> None:
    """A read-only web dashboard for the team, /api/gpus and /api/jobs as JSON, and Prometheus /metrics."""
    try:
        import prometheus_client  # noqa: F401 (the optional `serve` extra: fail now, not at the first scrape)
    except ImportError:
        raise GpuqError("gpuq serve needs prometheus-client: pip install 'gpuq-scheduler[serve]'") from None
    from gpuq_scheduler.launcher.gpus.sources import open_source
    from gpuq_scheduler.launcher.views.serve import serve as run_server

    source = open_source()
    try:
        run_server(ctx.jobs(), source, host, port, lambda url: click.echo(f"serving {url} (Ctrl-C stops)"))
    except OSError as err:
        raise GpuqError(f"cannot listen on {host}:{port}: {err.strerror}; pick another --port or --host") from None
    finally:
        source.close()


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of problems.")
@pass_ctx
def doctor(ctx: Context, as_json: bool) -> None:
    """Check the state directory for inconsistencies. Read-only; the daemon need not run. Exit 1 on errors."""
    from gpuq_scheduler.launcher.views import doctor as checks

    problems = checks.check(ctx.state)
    click.echo(json.dumps([p.to_json() for p in problems], indent=1) if as_json else checks.render(problems, ctx.state))
    if not as_json:
        click.echo(checks.containment(ctx.state))
    sys.exit(checks.exit_code(problems))

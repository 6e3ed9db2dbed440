"""`gpuq reserve`: hold GPUs for a user over a window of time; list and cancel reservations.

The client checks what it can read (the start time's grammar, the duration, a name) and says it in one line
(exit 2, nothing written); the daemon checks again what only it can (who asks, the quota, which GPUs are
free of other reservations), picks the GPUs and answers in ``reservations.json`` under the request's token.
"""

from __future__ import annotations

import json
import os
import time

import click

from gpuq_scheduler.jobs import accounts, config, reservations
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.reservations import Ask, Reservation, Unreserve, clock, gpu_list
from gpuq_scheduler.jobs.store import calendar, outbox
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.units import format_duration, parse_duration
from gpuq_scheduler.launcher.cli.context import NUMBER, Context, pass_ctx

PATIENCE = 30.0  # seconds the client waits for the daemon's answer


@click.command()
@click.option("--gpus", type=NUMBER, default=None, help="How many GPUs to reserve.")
@click.option("--start", "start", default=None, help="When: HH:MM, 'tomorrow HH:MM', 2026-12-01 09:00, +2h or now.")
@click.option("--duration", default=None, help="For how long: 3h, 90m, 1h30m.")
@click.option("--name", default=None, help="Its name (default: USER-N); jobs run in it with --reservation NAME.")
@click.option("--user", default=None, help="Reserve for this user (admins only).")
@click.option("--list", "listing", is_flag=True, help="List the reservations now and to come.")
@click.option("--cancel", "cancel", default=None, metavar="NAME", help="Cancel this reservation (owner or admin).")
@click.option("--json", "as_json", is_flag=True, help="With --list: JSON.")
@pass_ctx
def reserve(
    ctx: Context,
    gpus: int | None,
    start: str | None,
    duration: str | None,
    name: str | None,
    user: str | None,
    listing: bool,
    cancel: str | None,
    as_json: bool,
) -> None:
    """Reserve GPUs for a window of time: before it, only jobs that end in time (or --preemptible ones) run
    on them; at its start, preemptible jobs still there are suspended; during it, only your jobs given
    --reservation NAME run there.

    \b
        gpuq reserve --gpus 4 --start 'tomorrow 09:00' --duration 3h --name deadline
        gpuq submit --reservation deadline --gpus 4 train.py
        gpuq reserve --list
        gpuq reserve --cancel deadline
    """
    making = gpus is not None or start is not None or duration is not None or name is not None or user is not None
    if sum((listing, cancel is not None, making)) != 1:
        raise BadInput("give --list, --cancel NAME, or --gpus N --start WHEN --duration TIME (see `gpuq reserve -h`)")
    if listing:
        _list(ctx, as_json)
    elif cancel is not None:
        _cancel(ctx, cancel)
    else:
        _make(ctx, gpus, start, duration, name or "", user or "")


def _make(ctx: Context, gpus: int | None, start: str | None, duration: str | None, name: str, user: str) -> None:
    if gpus is None or start is None or duration is None:
        raise BadInput("a reservation needs --gpus N, --start WHEN and --duration TIME, like --duration 3h")
    if not 0 < gpus < reservations.MOST_GPUS:
        raise BadInput(f"--gpus {gpus}: reserve 1 GPU or more")
    now = time.time()
    begins = reservations.parse_start(start, now)
    try:
        ends = begins + parse_duration(duration)
    except BadInput as err:
        raise BadInput(f"--duration: {err}") from None
    reservations.check_window(begins, ends)
    reservations.check_user(user)
    if name:
        reservations.check_name(name)
    ask = Ask(os.urandom(16).hex(), gpus, begins, ends, name, user)
    Ask.from_json(ask.to_json())  # what the daemon holds it to: refused here first
    ctx.state.ensure()
    outbox.write_control(ctx.state, Action.RESERVE, [], ask)
    outbox.ensure_daemon(ctx.state)
    answer = _answer(ctx, ask.token)
    if answer is None:
        click.echo(
            f"asked for {gpus} GPU(s) from {clock(begins, now)}; the daemon has not answered yet: "
            "`gpuq reserve --list` shows it once it has"
        )
        return
    if isinstance(answer, str):
        raise BadInput(f"reservation refused: {answer}")
    click.echo(
        f"reserved {_gpus(answer)} for {answer.user} from {clock(answer.start, now)} to "
        f"{clock(answer.end, now)} as {answer.name}; run in it with --reservation {answer.name}"
    )
    for line in answer.said:
        click.echo(f"  note: {line}")


def _answer(ctx: Context, token: str) -> Reservation | str | None:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        found = calendar.read(ctx.state).answer(token, os.getuid())
        if found is not None:
            return found
        time.sleep(0.05)
    return None


def _cancel(ctx: Context, name: str) -> None:
    reservations.check_name(name)
    found = calendar.read(ctx.state).named(name)
    if found is None:
        raise BadInput(f"no reservation {name} (`gpuq reserve --list` lists them)")
    admins = config.load().shared.admins
    if not accounts.may_act(os.getuid(), found.uid, admins, ctx.state.owner()):
        raise BadInput(f"reservation {name} is {found.user}'s; only {found.user} or an admin can cancel it")
    outbox.write_control(ctx.state, Action.UNRESERVE, [], Unreserve(name))
    outbox.ensure_daemon(ctx.state)
    click.echo(f"cancelling reservation {name}")


def _list(ctx: Context, as_json: bool) -> None:
    now = time.time()
    found = [r for r in calendar.read(ctx.state).reservations if not r.over(now) or r.ended]
    found.sort(key=lambda r: (bool(r.ended), r.start))
    if as_json:
        click.echo(json.dumps([r.to_json() for r in found], indent=2))
        return
    if not found:
        click.echo("no reservations")
        return
    click.echo(f"{'NAME':<16} {'USER':<10} {'GPUS':<8} {'FROM':<16} {'UNTIL':<16} STATE")
    for r in found:
        click.echo(
            f"{r.name:<16} {r.user:<10} {gpu_list(r.gpus):<8} {clock(r.start, now):<16} "
            f"{clock(r.end, now):<16} {describe(r, now)}"
        )
        for line in r.said:
            click.echo(f"  note: {line}")


def describe(r: Reservation, now: float) -> str:
    if r.ended:
        return r.ended
    if r.active(now):
        return f"on, {format_duration(r.end - now)} left"
    return f"starts in {format_duration(r.start - now)}"


def _gpus(r: Reservation) -> str:
    return f"GPU{'s' if len(r.gpus) > 1 else ''} {gpu_list(r.gpus)}"

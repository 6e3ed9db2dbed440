"""`gpuq daemon ...`: start, stop and inspect the daemon; set up a shared queue for a machine's users."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.cli.context import Context


@click.group()
def daemon() -> None:
    """Start, stop or inspect the daemon for this state directory."""


@daemon.command("start")
@click.option("--shared", is_flag=True, help="Serve every user of this machine (run as root; see `daemon setup`).")
@click.pass_obj
def daemon_start(ctx: Context, shared: bool) -> None:
    from gpuq_scheduler.jobs import config
    from gpuq_scheduler.launcher.daemon import lifetime as lifetime

    state = ctx.state
    settings = config.load()  # a mistake in it is said here, not only in the log of a daemon that never started
    if shared and not os.environ.get("GPUQ_HOME") and settings.home is None:
        state = StateDir(config.SHARED_HOME)
    click.echo(f"daemon running (pid {lifetime.start(state, shared=shared)}) for {state.root}")


@daemon.command("setup")
@click.option("--admins", metavar="GROUP", help="Members of this group may act on anyone's jobs.")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), help="State directory (/var/lib/gpuq).")
def daemon_setup(admins: str | None, home: Path | None) -> None:
    """Set up a shared queue for this machine's users (as root): config, state directory, systemd unit."""
    from gpuq_scheduler.launcher.setup import shared

    done = shared.setup(admins, home.absolute() if home else None)
    click.echo(f"{'wrote' if done.wrote_config else 'kept'} {done.config}; queue in {done.home}")
    if done.unit is not None:
        click.echo(f"wrote {done.unit}; start it with: systemctl enable --now gpuq")
    else:
        click.echo("no systemd here; start the daemon with: gpuq daemon start --shared")


@daemon.command("unit")
def daemon_unit() -> None:
    """Print the systemd unit of a shared queue's daemon."""
    from gpuq_scheduler.launcher.setup import shared

    click.echo(shared.unit(), nl=False)


@daemon.command("stop")
@click.pass_obj
def daemon_stop(ctx: Context) -> None:
    from gpuq_scheduler.launcher.daemon import lifetime as lifetime

    pid = lifetime.stop(ctx.state)
    click.echo("no daemon was running" if pid is None else f"daemon {pid} stopped; running jobs carry on")


@daemon.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def daemon_status(ctx: Context, as_json: bool) -> None:
    from gpuq_scheduler.launcher.daemon import lifetime as lifetime

    pid = lifetime.running_pid(ctx.state)
    if pid is not None and pid < 0:
        pid = None
    running = lifetime.running_pid(ctx.state) is not None
    kind = "shared" if ctx.state.is_shared() else "personal"  # which queue this is: nothing else said it
    if as_json:
        click.echo(json.dumps({"running": running, "pid": pid, "queue": kind, "home": str(ctx.state.root)}))
    else:
        where = f"the {kind} queue in {ctx.state.root}"
        click.echo(f"daemon running, pid {pid}, for {where}" if running else f"no daemon running for {where}")

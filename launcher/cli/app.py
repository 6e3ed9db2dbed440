"""The ``gpuq`` command: each subcommand is a few lines over ``jobs`` and ``launcher``.

Library code raises GpuqError; ``main`` turns it into one line on stderr and exit code 2, with the
traceback only under ``--debug``. Heavy modules (NVML, psutil, sqlite for writers) load only in the
commands that need them, so ``gpuq submit`` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from gpuq_scheduler.jobs.errors import GpuqError
from gpuq_scheduler.launcher.cli import acting, interactive, jupyter, machine, own_jobs, reserve, status, suspend_resume
from gpuq_scheduler.launcher.cli.context import Context
from gpuq_scheduler.launcher.cli.daemon import daemon


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def gpuq(ctx: click.Context, debug: bool) -> None:
    """A GPU job queue for one workstation: submit runs, and a daemon places them on free GPUs."""
    ctx.obj = Context(debug)


for command in (
    own_jobs.submit,
    status.status,
    own_jobs.show,
    own_jobs.logs,
    acting.cancel,
    own_jobs.wait_command,
    acting.hold,
    acting.release,
    acting.update,
    suspend_resume.suspend,
    suspend_resume.resume,
    machine.gpus,
    machine.drain,
    machine.undrain,
    machine.pause,
    machine.unpause,
    machine.report,
    machine.doctor,
    machine.top,
    machine.serve,
    interactive.run,
    interactive.alloc,
    interactive.release_alloc,
    jupyter.jupyter,
    reserve.reserve,
    daemon,
):
    gpuq.add_command(command)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # Only gpuq's own --debug, before the command: a job's arguments may contain the same word.
    debug = "--debug" in args[: next((i for i, a in enumerate(args) if not a.startswith("-")), len(args))]
    try:
        gpuq.main(args=argv, prog_name="gpuq", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.exceptions.NoArgsIsHelpError as err:  # `gpuq` or `gpuq daemon` alone: the help was asked for
        click.echo(err.ctx.get_help() if err.ctx is not None else err.format_message())
        sys.exit(0)
    except click.UsageError as err:
        hint = f" (see `{err.ctx.command_path} --help`)" if err.ctx is not None else ""
        click.echo(f"gpuq: {err.format_message()}{hint}", err=True)
        sys.exit(2)
    except click.ClickException as err:
        click.echo(f"gpuq: {err.format_message()}", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except GpuqError as err:
        if debug:
            raise
        click.echo(f"gpuq: {err}", err=True)
        sys.exit(err.exit_code)


if __name__ == "__main__":
    main()

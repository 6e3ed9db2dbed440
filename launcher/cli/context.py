"""What every `gpuq` command gets: the state directory and the queue, on click's context object."""

from __future__ import annotations

from typing import Any

import click

from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir


class Context:
    def __init__(self, debug: bool) -> None:
        self.debug = debug
        self.state = StateDir.from_env()
        self.queue = Queue(self.state)

    def jobs(self) -> Queue:
        """The queue to read and cancel through: this machine's, plus the jobs sent to clusters from here."""
        from gpuq_scheduler.jobs.api import readers

        return readers(self.state)


pass_ctx = click.make_pass_decorator(Context)


class JobCommand(click.Command):
    """A command that ends in a job's COMMAND [ARGS]... (`gpuq submit`, `gpuq run`): gpuq's own options are
    gpuq's wherever they stand before ``--``, after the command too; everything after ``--`` is the job's.
    The rule is ``launcher.cli.submit.split``'s, which the quick `gpuq submit` parser follows too.
    ``directives``: the script's ``#GPUQ`` lines count (``jobs.directives``), as `gpuq submit`'s do."""

    directives = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from gpuq_scheduler.launcher.cli.submit import split

        takes_value = {flag: not p.is_flag for p in self.params if isinstance(p, click.Option) for flag in p.opts}
        own, command = split(args, takes_value)
        if self.directives and command:
            from gpuq_scheduler.jobs.directives import merged

            own, ctx.meta[FROM_SCRIPT] = merged(own, command, takes_value)
        try:
            return super().parse_args(ctx, [*own, "--", *command] if command else own)
        except click.BadParameter as err:
            # gpuq took an option from after the command that the job meant as its own (train.py --mode eval)
            flag = next((opt for opt in (err.param.opts if err.param else []) if opt in own), None)
            if flag is not None and command and flag in args[args.index(command[0]) + 1 :]:
                hint = f"{err.message.rstrip('.')}; if {flag} is {command[0]}'s own, give it after --"
                raise click.BadParameter(hint, ctx=err.ctx, param=err.param) from None
            raise


class SubmitCommand(JobCommand):
    """`gpuq submit`: a JobCommand that reads its script's ``#GPUQ`` lines; the words they gave are in
    ``ctx.meta[FROM_SCRIPT]``."""

    directives = True


FROM_SCRIPT = "gpuq.from_script"


class _Number(click.types.IntParamType):
    """click's INT for numbers a user types: only 0-9 (``int()`` also reads Arabic-Indic and other digits,
    which then pass unseen as ids and counts)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value).strip()
        if text.isascii():
            try:
                return int(text)
            except ValueError:
                pass
        self.fail(f"{text[:40]!r} is not a valid integer (write it with the digits 0-9)", param, ctx)


NUMBER = _Number()

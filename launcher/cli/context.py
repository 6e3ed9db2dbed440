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

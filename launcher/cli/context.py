"""What every `gpuq` command gets: the state directory and the queue, on click's context object."""

from __future__ import annotations

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

"""Errors a user can act on. ``str(error)`` is the one line the CLI prints; exit code 2 by default."""

from __future__ import annotations


class GpuqError(Exception):
    """Base class: the message says what went wrong and what to do next."""

    exit_code = 2


class BadInput(GpuqError):
    """The user asked for something malformed or impossible (bad size, unknown option value...)."""


class UnknownJob(GpuqError):
    """A job id that the queue has never issued."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job {job_id} in this queue; `gpuq status --all` lists the known ids")
        self.job_id = job_id


class NotPermitted(GpuqError):
    """The caller is neither the job's owner nor an admin."""


class StateDirError(GpuqError):
    """The state directory cannot be used (unreadable, unwritable, full, from a newer gpuq)."""


class DaemonError(GpuqError):
    """The daemon could not be started, stopped or reached."""


class NoIdYet(GpuqError):
    """A submit to a shared queue that is durably queued but has no id yet: there only the daemon gives ids,
    and it is not running (or did not answer in time). Not a failure: the job runs once the daemon reads it,
    and ``gpuq status`` then lists it. ``request`` names its request (the token in its spool file's name)."""

    exit_code = 0

    def __init__(self, message: str, request: str) -> None:
        super().__init__(message)
        self.request = request

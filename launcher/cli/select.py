"""Choosing jobs by name, state and user on the command line (``jobs.selection``): the options the commands
share, the jobs they choose, and the line that says which they acted on."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import click

from gpuq_scheduler.jobs import accounts
from gpuq_scheduler.jobs.errors import BadInput, NotPermitted
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.selection import Selection, check_user
from gpuq_scheduler.jobs.store import rights
from gpuq_scheduler.launcher.cli.context import Context, _Number


def selection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--name, --state and --user, as `squeue`/`scancel` -n, -t and -u."""
    for flag, metavar, text in reversed(
        (
            ("--name", "GLOB", "Only jobs whose name matches GLOB ('seed*')."),
            ("--state", "STATE", "Only jobs in STATE (pending, running, ...; several: pending,running)."),
            ("--user", "NAME", "Only NAME's jobs (another's: an admin only, where acting on them)."),
        )
    ):
        command = click.option(flag, flag[2:], metavar=metavar, default=None, help=text)(command)
    return command


class _JobId(_Number):
    """A job id; `gpuq cancel all` (as `tsp -C`, or a guess) is told the option that does it."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, str) and value.strip().lower() == "all":
            verb = ctx.command.name if ctx is not None and ctx.command.name else "cancel"
            rest = "--all" if verb == "cancel" else f"--user {me()}"
            raise BadInput(f"`gpuq {verb} all`: ids are numbers; to {verb} all your jobs, type `gpuq {verb} {rest}`")
        return super().convert(value, param, ctx)


JOB_ID = _JobId()


def me() -> str:
    return accounts.user_name(os.getuid())


def chosen(
    ctx: Context,
    action: str,
    selection: Selection,
    job_ids: Sequence[int],
    among: Iterable[JobState],
    held: bool | None = None,
) -> list[JobRecord]:
    """The jobs ``action`` applies to: those named by ``job_ids`` (an array's id stands for its members), or
    without ids, every active job; then those of them ``selection`` chooses, in ``among`` (and held or not,
    where ``held`` says). Without ids or --user, one's own jobs only. Another's jobs through --user only for
    whoever may act on them (the queue's owner, an admin), refused in one line before anything is asked."""
    uid = os.getuid()
    if selection.user is not None and selection.user != me():
        owner = check_user(selection.user)
        if not rights.may_act(ctx.state, uid, owner):
            raise NotPermitted(
                f"--user {selection.user}: only {selection.user} or an admin can {action} {selection.user}'s jobs"
            )
    if not job_ids and selection.user is None:
        selection = Selection(selection.name, selection.states, me(), selection.all)
    queue = ctx.jobs()
    records = queue.resolve(job_ids) if job_ids else queue.records(active_only=True)
    wanted = set(among)
    return [
        r
        for r in records
        if r.state in wanted
        and (held is None or r.held == held)
        and selection.matches(r.spec.display_name, r.user, r.state)
    ]


def need_some(command: str, job_ids: Sequence[int], selection: Selection, all_option: bool = False) -> None:
    """Ids or a selection: nothing at all is a usage error, not every job."""
    if not job_ids and not selection.given:
        everything = ", or --all for all your jobs" if all_option else ""
        raise BadInput(
            f"`gpuq {command}` needs job ids, or jobs chosen with --name GLOB, --state STATE or --user NAME{everything}"
        )


def listed(ids: Sequence[int], most: int = 20) -> str:
    """Ids for a line: "4, 5, 7", or the first ``most`` and how many more."""
    shown = ", ".join(map(str, ids[:most]))
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


def nothing(action: str, selection: Selection, job_ids: Sequence[int], what: str) -> str:
    """The line for a selection that chose no job."""
    whose = "" if job_ids or selection.user is not None else " of yours"
    among = f" among {listed(job_ids)}" if job_ids else ""
    if selection.words() == "--all":
        return f"you have no {what} job{among}; nothing to {action}"
    return f"no {what} job{whose} matches {selection.words()}{among}; nothing to {action}"

"""Jobs chosen by what they are rather than by id: `gpuq status/cancel/hold/... --name GLOB --state STATE
--user NAME` (Slurm's `squeue -n -t -u`, `scancel -n -t -u`), and `gpuq cancel --all`.

A ``Selection`` is plain data and its checks; the commands read the jobs and act (``launcher.cli.select``).
Who may act on whose jobs is not decided here: the commands check it as they check ids (``store.rights``),
and the daemon checks each request's owner again.
"""

from __future__ import annotations

import fnmatch
import pwd
from dataclasses import dataclass

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.outcome import JobState

STATES = tuple(state.value for state in JobState)


@dataclass(frozen=True)
class Selection:
    """Which jobs: those whose name matches ``name`` (a shell glob), whose state is one of ``states``, and
    whose user is ``user``; a field left empty chooses every job. ``all`` is `gpuq cancel --all`."""

    name: str | None = None
    states: frozenset[JobState] = frozenset()
    user: str | None = None
    all: bool = False

    @property
    def given(self) -> bool:
        return self.name is not None or bool(self.states) or self.user is not None or self.all

    def matches(self, name: str, user: str, state: JobState) -> bool:
        return (
            (self.name is None or fnmatch.fnmatchcase(name, self.name))
            and (not self.states or state in self.states)
            and (self.user is None or user == self.user)
        )

    def words(self) -> str:
        """The selection as it was typed, for the line that says what was chosen: "--name 'seed*' --state pending"."""
        parts = [f"--name {self.name!r}"] if self.name is not None else []
        if self.states:
            parts.append("--state " + ",".join(s.value for s in JobState if s in self.states))
        if self.user is not None:
            parts.append(f"--user {self.user}")
        return " ".join(parts) or "--all"


def parse(
    name: str | None = None,
    state: str | None = None,
    user: str | None = None,
    *,
    everything: bool = False,
    allowed: tuple[JobState, ...] = tuple(JobState),
) -> Selection:
    """A Selection from the command line's words, each checked: ``state`` one or more of ``allowed``
    (comma-separated, any case), ``user`` a user of this machine, ``name`` a glob."""
    if name is not None and (not name or "\0" in name):
        raise BadInput("--name takes a job name or a glob (--name 'seed*')")
    states: set[JobState] = set()
    for word in (state or "").split(",") if state is not None else ():
        found = next((s for s in JobState if s.value == word.strip().lower()), None)
        if found is None or found not in allowed:
            known = ", ".join(s.value for s in allowed)
            what = "not a job state" if found is None else f"a {found.value} job cannot be chosen here"
            raise BadInput(f"--state {word.strip()[:40]!r}: {what}; give one of {known}")
        states.add(found)
    if user is not None:
        check_user(user)
    return Selection(name, frozenset(states), user, everything)


def check_user(name: str) -> int:
    """The uid of user ``name``; BadInput if this machine has no such user."""
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError):
        raise BadInput(f"--user {name[:40]!r}: no such user on this machine") from None

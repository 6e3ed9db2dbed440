"""What `gpuq status` and `gpuq doctor` say about the daemon beyond the job table: passes that keep failing,
and a user's requests that were set aside (``jobs.store.notices`` keeps both; the daemon need not run)."""

from __future__ import annotations

import time

from gpuq_scheduler.jobs.shown import shown
from gpuq_scheduler.jobs.store import notices
from gpuq_scheduler.jobs.store.statedir import StateDir

RECENT = 86400.0  # set-aside requests older than a day are history, not news


def failing_pass(state: StateDir) -> str | None:
    """ "the daemon's pass has failed 312 times since 02:14: <error>", or None while passes succeed."""
    found = notices.read_pass_failure(state)
    if found is None:
        return None
    since = time.strftime("%H:%M", time.localtime(found["since"]))
    return (
        f"the daemon's pass has failed {int(found['count'])} times since {since}: {shown(found['error'])}; "
        "nothing is being queued or started: the daemon's log says more"
    )


def set_aside(state: StateDir, uid: int, now: float | None = None) -> list[str]:
    """``uid``'s requests set aside in the last day, each with why."""
    now = time.time() if now is None else now
    return [
        f"your request {shown(n['file'])} was set aside at {time.strftime('%H:%M', time.localtime(n['t']))}: "
        f"{'it ' if n['reason'].split(' ', 1)[0] in _VERBS else ''}{shown(n['reason'])}"
        for n in notices.read_set_aside(state, uid)
        if now - n["t"] < RECENT
    ]


# A reason as the spool words one ("is not JSON", "has an id that...") reads after "it"; a rule's words
# ("--name holds...") read alone.
_VERBS = {"is", "has", "asks", "names", "gives", "updates", "made", "claims", "lacks", "cannot", "holds"}


def daemon_down(state: StateDir) -> bool:
    """True when the queue exists and no daemon listens for it (``outbox.listening``); readers never need one."""
    from gpuq_scheduler.jobs.store.outbox import listening

    return state.exists() and not listening(state)


def queue_line(state: StateDir, down: bool) -> str:
    """Which queue this is (personal or shared) and, when ``down``, that its daemon is not running: a job it
    last saw running may have ended since, and nothing new starts until it is back."""
    where = f"{'shared' if state.is_shared() else 'personal'} queue in {state.root}"
    if not state.exists():
        return f"{where}: nothing submitted yet"
    if not down:
        return where
    start = "ask its admin: `sudo systemctl start gpuq`" if state.is_foreign() else "`gpuq daemon start`"
    return f"{where}: its daemon is not running; jobs it saw running show as unknown until it is back ({start})"

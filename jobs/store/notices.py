"""What the daemon tells readers that the job table cannot: requests it set aside, passes that fail, and
batch jobs whose GPUs do no work.

``notices/<uid>.json``: that user's latest requests the daemon set aside, with why (the owner reads it in
`gpuq status`; it belongs to them, readable by nobody else, as their logs are). ``notices/pass.json``: the
daemon's passes have been failing since when, how many times, with what error (everyone reads it: a queue
that does not move is everyone's business; the error names no job's command or environment).
``notices/idle.json``: the running batch jobs whose GPUs did no work for ``idle_report`` or more, and for how
many seconds, as typed facts for `gpuq doctor` (everyone reads it: ids and durations, as `gpuq status` shows
each job's reason to all). The daemon writes them (atomically, in a directory it owns); readers never need
it running.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import NOTICES, StateDir

KEEP = 20  # set-aside notices kept per user: the latest say what to fix
PASS = "pass.json"
IDLE = "idle.json"


def _directory(state: StateDir) -> str:
    directory = state.at(NOTICES)
    os.makedirs(directory, mode=0o711, exist_ok=True)
    return directory


def set_aside(state: StateDir, uid: int, name: str, reason: str, when: float) -> None:
    """Tell ``uid`` that their request ``name`` was set aside, and why."""
    path = os.path.join(_directory(state), f"{uid}.json")
    kept = [*read_set_aside(state, uid), {"file": name, "reason": reason, "t": when}][-KEEP:]
    write_atomic(path, json.dumps(kept).encode(), durable=False, mode=0o600)
    if os.geteuid() == 0 and uid != 0:
        with contextlib.suppress(OSError):
            os.chown(path, uid, -1)


def read_set_aside(state: StateDir, uid: int) -> list[dict[str, Any]]:
    """``uid``'s set-aside requests, oldest first: [{"file", "reason", "t"}]; [] if none or unreadable."""
    data = _read(os.path.join(state.at(NOTICES), f"{uid}.json"))
    if not isinstance(data, list):
        return []
    return [
        n
        for n in data
        if isinstance(n, dict)
        and isinstance(n.get("file"), str)
        and isinstance(n.get("reason"), str)
        and isinstance(n.get("t"), (int, float))
    ]


def pass_failed(state: StateDir, error: str, when: float) -> None:
    """Count one more failed pass (the first one's time is kept: "failing since")."""
    path = os.path.join(_directory(state), PASS)
    last = read_pass_failure(state)
    count, since = (last["count"] + 1, last["since"]) if last else (1, when)
    body = {"count": count, "since": since, "last": when, "error": error[:500]}
    write_atomic(path, json.dumps(body).encode(), durable=False, mode=0o644)


def pass_succeeded(state: StateDir) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(state.at(NOTICES), PASS))


def read_pass_failure(state: StateDir) -> dict[str, Any] | None:
    """{"count", "since", "last", "error"} while the daemon's passes fail; None once one succeeds."""
    data = _read(os.path.join(state.at(NOTICES), PASS))
    if not isinstance(data, dict):
        return None
    if not all(isinstance(data.get(k), (int, float)) for k in ("count", "since", "last")):
        return None
    if not isinstance(data.get("error"), str):
        return None
    return data


def idle_batch(state: StateDir, idle: dict[int, float]) -> None:
    """The running batch jobs idle now, and for how many seconds (none: the file goes)."""
    path = os.path.join(_directory(state), IDLE)
    if not idle:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    body = {str(job_id): seconds for job_id, seconds in sorted(idle.items())}
    write_atomic(path, json.dumps(body).encode(), durable=False, mode=0o644)


def read_idle_batch(state: StateDir) -> dict[int, float]:
    """The batch jobs whose GPUs did no work, with the seconds, as the daemon last said; {} if none or unreadable."""
    data = _read(os.path.join(state.at(NOTICES), IDLE))
    if not isinstance(data, dict):
        return {}
    return {
        int(job): float(seconds)
        for job, seconds in data.items()
        if job.isdecimal() and isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    }


def _read(path: str) -> Any:
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return None

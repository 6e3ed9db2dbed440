"""The clients' side of the spool (see ``jobs.store.spool``): drop a request in, wake the daemon, learn its id.

Who gives a job its id depends on who can write the counter. A personal queue's clients reserve ids from
``next_id`` under flock (its directory is its user's alone, and reserving ids needs no daemon). In a shared
queue nothing its users can write may decide another's job: a submit is named by a random token and carries
no id, the daemon gives it one when it reads it, records it, and answers in ``answers/<token>``, which only
the client that knows the token can open. Either way a client prints an id only once the job is on disk.

Standard library and plain dicts only, so that the quick ``gpuq submit`` path writes requests without
loading the job model (dataclasses, enum), SQLite, subprocess or json (``jobs.jsontext`` writes the
JSON). The daemon reads what is written here through ``jobs.store.spool``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time

from gpuq_scheduler.jobs import jsontext
from gpuq_scheduler.jobs.errors import BadInput, DaemonError, NoIdYet, StateDirError
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import NEXT_ID, REQUEST_SCHEMA, SPOOL, WAKE, StateDir, submit_name

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpuq_scheduler.jobs.store.action_values import ActionValues
    from gpuq_scheduler.jobs.store.actions import Action


def allocate_ids(state: StateDir, count: int = 1) -> int:
    """Reserve ``count`` consecutive job ids and return the first; safe across concurrent clients."""
    counter = state.at(NEXT_ID)
    try:
        fd = os.open(counter, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise StateDirError(f"cannot open {counter}: {err.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 64, 0).strip()
        first = int(raw) if raw.isdigit() else _first_unused_id(state)
        data = f"{first + count}\n".encode()
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(errno.ENOSPC, "short write")
        os.ftruncate(fd, len(data))
        os.fsync(fd)
        return first
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StateDirError(f"no space left in {state.text}: free some disk space and try again") from None
        raise StateDirError(f"cannot update {counter}: {err.strerror}") from None
    finally:
        os.close(fd)


def _first_unused_id(state: StateDir) -> int:
    """The counter is missing or damaged: start above every id the table and the spool hold, never at 1
    (a reused id would be dropped by the daemon as already ingested). Rare, so reading the spool's requests
    (the job model) and the table (sqlite) is fine here."""
    from gpuq_scheduler.jobs.store.spool import pending_submits

    highest = 0
    for request in pending_submits(state):
        highest = max(highest, request.job_id + (len(request.array.indices) if request.array else 0))
    if state.db.exists():
        from gpuq_scheduler.jobs.store.table import JobTable

        table = JobTable(state.db)
        try:
            highest = max(highest, table.max_id(), *(a.id + a.size for a in table.arrays().values()))
        finally:
            table.close()
    return highest + 1


def raise_counter(state: StateDir, minimum: int) -> None:
    """Make sure the next id handed out is at least ``minimum`` (the daemon knows every id in use; a
    counter restored from a backup or deleted by hand must not hand one out again)."""
    fd = os.open(state.next_id, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 64, 0).strip()
        if raw.isdigit() and int(raw) >= minimum:
            return
        data = f"{minimum}\n".encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


ANSWER_PATIENCE = 60.0  # seconds a shared queue's client waits for a running daemon's answer
REJECTED_ANSWER = b"rejected: "  # an answer that is not an id: the request was set aside, and why


def post_submit(
    state: StateDir,
    spec: Mapping[str, Any],
    array: tuple[tuple[int, ...], int | None] | None = None,
    *,
    submitted_at: float,
    patience: float | None = ANSWER_PATIENCE,
) -> int:
    """Queue a job (or an array: its id, then one per member) durably and return its id.

    ``spec`` is ``JobSpec.to_json()``'s dict; ``array`` is (member indices, how many may run at once).
    Checks are the caller's: once this returns, the job is queued durably. In a shared queue the id is the
    daemon's answer: ``patience`` is how long to wait for it (None: for as long as it takes, the daemon
    started or not); NoIdYet says the job is queued but has no id yet.
    """
    if not state.is_shared():
        job_id = allocate_ids(state, 1 if array is None else 1 + len(array[0]))
        write_submit(state, job_id, spec, submitted_at, array)
        return job_id
    token = os.urandom(16).hex()
    write_request(state.token_request(token), None, spec, submitted_at, array)
    return await_id(state, token, patience)


def write_submit(
    state: StateDir,
    job_id: int,
    spec: Mapping[str, Any],
    submitted_at: float,
    array: tuple[tuple[int, ...], int | None] | None = None,
) -> str:
    """A personal queue's submit request for job ``job_id`` (reserved by ``allocate_ids``)."""
    return write_request(state.at(SPOOL, submit_name(job_id)), job_id, spec, submitted_at, array)


def write_request(
    path: str,
    job_id: int | None,
    spec: Mapping[str, Any],
    submitted_at: float,
    array: tuple[tuple[int, ...], int | None] | None = None,
) -> str:
    body: dict[str, Any] = {"schema": REQUEST_SCHEMA, "kind": "submit"}
    if job_id is not None:
        body["id"] = job_id
    body["submitted_at"] = submitted_at
    body["spec"] = spec
    if array is not None:
        body["array"] = {"indices": list(array[0]), "throttle": array[1]}
    write_atomic(path, jsontext.encode(body))
    return path


def await_id(state: StateDir, token: str, patience: float | None) -> int:
    """The id the shared queue's daemon gave the submit named ``token`` (``answers/<token>``)."""
    deadline = None if patience is None else time.monotonic() + patience
    delay, poked_at = 0.002, time.monotonic()
    running = told = poke(state)
    while True:
        answer = read_answer(state, token)
        if answer is not None:
            return answer
        if not told and patience is None:  # waiting however long it takes: say for what, once
            sys.stderr.write(f"gpuq: queued; waiting for the daemon of the shared queue in {state.text} to start\n")
            told = True
        if not running and patience is not None:
            raise NoIdYet(
                f"queued, but the daemon of the shared queue in {state.text} is not running, so the job has no "
                "id yet; it runs once the daemon is started (ask its admin), and `gpuq status` lists it then",
                token,
            )
        if deadline is not None and time.monotonic() > deadline:
            raise NoIdYet(
                f"queued, but the daemon of the shared queue in {state.text} has not read it within "
                f"{patience:.0f}s, so the job has no id yet; `gpuq status` lists it once the daemon has",
                token,
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)
        if time.monotonic() - poked_at > 1.0:  # a daemon started meanwhile, or one that missed the poke
            running, poked_at = poke(state), time.monotonic()


def read_answer(state: StateDir, token: str) -> int | None:
    try:
        fd = os.open(state.answer(token), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StateDirError(f"cannot read the daemon's answer {state.answer(token)}: {err.strerror}") from None
    try:
        raw = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if raw.startswith(REJECTED_ANSWER):
        raise BadInput(f"the daemon set the request aside: it {raw[len(REJECTED_ANSWER) :].decode(errors='replace')}")
    return int(raw) if raw.isdigit() else None  # not yet whole: the daemon renames it in, so never


def write_control(state: StateDir, action: Action, ids: list[int], values: ActionValues | None = None) -> str:
    """A control request; ``values``: the type ``action`` carries (``jobs.store.action_values``), written by its
    own ``to_json`` (called, not imported: this module loads no dataclass)."""
    path = state.control_request(os.urandom(16).hex())
    written = {} if values is None else values.to_json()
    body = {"schema": REQUEST_SCHEMA, "kind": "control", "action": action, "ids": ids, "values": written}
    write_atomic(path, jsontext.encode(body))
    return path


def write_cancel(state: StateDir, job_ids: list[int]) -> str:
    path = state.cancel_request(os.urandom(16).hex())
    body = {"schema": REQUEST_SCHEMA, "kind": "cancel", "ids": job_ids}
    write_atomic(path, jsontext.encode(body))
    return path


def poke(state: StateDir) -> bool:
    """Wake the daemon. False when no daemon is listening (nobody holds the FIFO open for reading)."""
    try:
        fd = os.open(state.at(WAKE), os.O_WRONLY | os.O_NONBLOCK)
    except OSError as err:
        if err.errno in (errno.ENXIO, errno.ENOENT):
            return False
        raise StateDirError(f"cannot reach the daemon through {state.at(WAKE)}: {err.strerror}") from None
    try:
        os.write(fd, b"!")
    except BlockingIOError:
        pass  # the FIFO is full of wake-ups already: the daemon will wake
    finally:
        os.close(fd)
    return True


def listening(state: StateDir) -> bool:
    """Whether a daemon reads the queue's wake FIFO: a reader's probe, light enough for `gpuq status` (the
    daemon's own lifetime module costs 30 ms to import), and unlike a probe of ``daemon.lock`` it never
    holds the lock, not even for a moment in which a client starting a daemon would find it taken."""
    try:
        fd = os.open(state.at(WAKE), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False  # ENXIO: nobody reads it; ENOENT: no queue yet; EACCES: not ours to reach
    os.close(fd)
    return True


def ensure_daemon(state: StateDir) -> bool:
    """Wake the daemon, starting one if none runs. True if one was started."""
    if poke(state):
        return False
    if state.is_foreign():  # a shared queue: its admin runs the daemon; the job waits for it, safely queued
        sys.stderr.write(
            f"gpuq: the daemon of the shared queue in {state.root} is not running; jobs wait until it is "
            "(ask its admin: `sudo systemctl start gpuq`)\n"
        )
        return False
    return start_daemon(state)


def keep_daemon(state: StateDir, said: bool) -> bool:
    """For a wait: wake the daemon, starting a personal queue's as a submit does (and saying so: it had died
    or been stopped). A shared queue's that is down is said once (``said``: already said), and the wait goes
    on: its admin starts it, and the jobs are safe meanwhile. Returns whether that has been said."""
    if poke(state):
        return said
    if state.is_foreign():
        if not said:
            sys.stderr.write(
                f"gpuq: the daemon of the shared queue in {state.root} is not running; still waiting: jobs "
                "end and start once it is back (ask its admin: `sudo systemctl start gpuq`)\n"
            )
        return True
    if start_daemon(state):
        sys.stderr.write(f"gpuq: the daemon of the queue in {state.root} was not running; started it\n")
    return said


def start_daemon(state: StateDir, *, shared: bool = False) -> bool:
    """Start a daemon for ``state`` in its own session, detached from this process. False if one already
    holds the lock (it runs, or is starting and will read the spool on its first pass).

    The daemon lives in ``launcher.daemon.lifetime``; we start it as a process, not an import, so that ``jobs``
    stays free of the launcher (and its NVML and psutil). We take the daemon's lock here and hand it to the
    child, so that there is no moment in which a daemon is starting but the lock is free: two clients that
    both found no daemon listening could otherwise start two, and the second would take over the queue
    if the first was stopped while the second was still importing (a `daemon stop` then never ends).
    """
    if state.is_foreign():
        from gpuq_scheduler.jobs.accounts import user_name

        raise DaemonError(
            f"the queue in {state.root} belongs to {user_name(state.owner())} and its daemon is not "
            "running; ask its admin to start it (`sudo systemctl start gpuq`)"
        )
    import subprocess  # ~15 ms: paid only by the submit that finds no daemon running

    state.ensure()
    try:
        lock = os.open(state.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise DaemonError(f"cannot open {state.lock}: {err.strerror}") from None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        with state.daemon_log.open("ab") as log:
            try:
                child = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gpuq_scheduler.launcher.daemon",
                        "--home",
                        str(state.root),
                        "--lock-fd",
                        str(lock),
                        *(["--shared"] if shared else []),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd="/",
                    start_new_session=True,
                    pass_fds=(lock,),
                )
            except OSError as err:
                raise DaemonError(f"cannot start the gpuq daemon: {err}; see {state.daemon_log}") from None
        # The lock is the child's from here on (it shares this open file); its pid is known now, so nobody
        # probing the lock reads a pid file left by an earlier daemon.
        write_atomic(state.pid, f"{child.pid}\n".encode(), durable=False, mode=0o644)
        return True
    finally:
        os.close(lock)

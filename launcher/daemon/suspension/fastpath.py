"""The suspend helper's side of the fast path (``jobs.fastsuspend``): ask a job's CUDA processes to move their
PyTorch memory to host memory themselves, read what each says, and at resume ask them to bring it back.

A process is asked only if it catches ``SUSPEND_SIGNAL`` (``SigCgt`` in /proc/PID/status): gpuq's handler,
installed at its start for a ``--preemptible`` job; the signal would end any other. Each answer is a file in
the job's fast directory (``run/<id>.fast``, the job's own): ``<pid>.released`` once its memory is out, then
``<pid>.restored``. What a job writes there decides only how its own suspend goes; the driver's checkpoint of
what is left runs after it either way (but for an MPS client, which it cannot take), so a job that claims
more than it released still leaves its GPU empty.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuq_scheduler.jobs import fastsuspend
from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.jobs.fastsuspend import DIR_ENV, RESUME_SIGNAL, SUSPEND_SIGNAL, Fallback, Order, Path, pool_file
from gpuq_scheduler.launcher.daemon.suspension.hostmem import resident

POLL = 0.005  # seconds between looks for an answer
ANSWER_BASE = 30.0  # seconds a job may take to start answering, beyond its copy
POOL_ENV = "GPUQ_FAST_POOL"  # on / off: jobs always / never keep their pinned host memory (else: where it pays)
ANSWER_RATE = 1e9  # bytes a second its copy is given: below the 2.5 GB/s of a copy that pins afresh (H200 VM)


# Loaded first by every Python of a --preemptible job (PYTHONPATH): gpuq's handler, from the installed file
# (the job's interpreter need not be gpuq's), then the job's own sitecustomize, if it has one.
# The job's own is run from its spec, not imported: this module is sitecustomize while it runs, and taking
# it out of sys.modules to import another breaks the import of this one (Python 3.11: KeyError).
SITE = """import importlib.machinery as _l, importlib.util as _u, sys as _s
_spec = _u.spec_from_file_location("gpuq_fastsuspend", {module!r})
_m = _u.module_from_spec(_spec); _s.modules["gpuq_fastsuspend"] = _m; _spec.loader.exec_module(_m)
_m.install_from_env()
_s.path[:] = [p for p in _s.path if p != {site!r}]
_own = _l.PathFinder.find_spec("sitecustomize", _s.path)
if _own is not None and _own.loader is not None:
    _own.loader.exec_module(_u.module_from_spec(_own))
"""


def prepare(directory: str, env: dict[str, str], account: Account | None) -> dict[str, str]:
    """Make the job's fast directory (its own: ``account``'s on a shared queue) with gpuq's sitecustomize in
    it, and say what the job's environment gains: that directory, the site on PYTHONPATH, and PyTorch's
    expandable segments (where the job did not choose itself), the memory the fast path can move."""
    site = os.path.join(directory, "site")
    os.makedirs(site, mode=0o700, exist_ok=True)
    path = os.path.join(site, "sitecustomize.py")
    with open(path + ".tmp", "w") as handle:
        handle.write(SITE.format(module=fastsuspend.__file__, site=site))
    os.replace(path + ".tmp", path)
    if account is not None:
        for each in (directory, site, path):
            os.chown(each, account.uid, account.gid)
    added = {DIR_ENV: directory, "PYTHONPATH": os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)}
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" not in conf:
        added["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(p for p in (conf, "expandable_segments:True") if p)
    return added


def remove(directory: str) -> None:
    """Remove a job's fast directory once its run is over (it ended, or is queued again): nothing in it means
    anything to another run. The job's own: removed without following a link found in it."""
    shutil.rmtree(directory, ignore_errors=True)  # fd-based on Linux (shutil.rmtree.avoids_symlink_attacks)


def sweep(run: str, live: set[int]) -> None:
    """At the daemon's start: remove the fast directories in ``run`` of jobs not running or suspended (an
    earlier daemon's, killed before it removed them). A suspended job's stays: its resume reads it."""
    with contextlib.suppress(OSError):
        for name in os.listdir(run):
            job, dot, kind = name.partition(".")
            if dot and kind == "fast" and job.isdigit() and int(job) not in live:
                remove(os.path.join(run, name))


@dataclass(frozen=True)
class Released:
    """How a job's suspend went on the fast path: which path, why not the fast one, and what each said."""

    path: Path
    fallback: Fallback | None
    detail: str
    answers: dict[int, dict[str, Any]]

    @property
    def released(self) -> set[int]:
        """The processes whose memory is in host memory now."""
        return {pid for pid, answer in self.answers.items() if answer.get("ok")}

    def facts(self) -> dict[str, Any]:
        """For the helper's result (and the ``suspended`` event)."""
        seconds = max((float(a.get("seconds") or 0.0) for a in self.answers.values() if a.get("ok")), default=0.0)
        moved = sum(int(a.get("bytes") or 0) for a in self.answers.values() if a.get("ok"))
        fallback = self.fallback.value if self.fallback is not None else None
        return {
            "path": self.path.value,
            "fallback": fallback,
            "detail": self.detail,
            "fast_bytes": moved,
            "fast_seconds": round(seconds, 3),
        }


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (else the signal's default would end it)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _job_file(path: str | os.PathLike[str], limit: int) -> dict[str, Any] | None:
    """A JSON object the job wrote in its own directory, read as root may read it: no link followed, nothing
    but a regular file (a FIFO put there would hold the reader forever: the daemon's pass reads pool files),
    at most ``limit`` bytes; None for anything else (a job that is not gpuq's handler wrote it, or nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        found = json.loads(os.read(fd, limit))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return found if isinstance(found, dict) else None


def _answer(directory: str, pid: int, what: str) -> dict[str, Any] | None:
    """A process's answer file (``<pid>.released``, ``.restored``), or None."""
    return _job_file(os.path.join(directory, f"{pid}.{what}"), 65536)


def _wait(directory: str, pids: list[int], what: str, within: float) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + within
    answers: dict[int, dict[str, Any]] = {}
    while True:
        for pid in pids:
            if pid not in answers and (found := _answer(directory, pid, what)) is not None:
                answers[pid] = found
        if len(answers) == len(pids) or time.monotonic() > deadline:
            return answers
        time.sleep(POLL)


def _order(directory: str, action: Order, **more: Any) -> None:
    """What the job's handler reads when signalled (``order.json``), under an id of its own (a signal
    delivered twice is acted on once), written in the job's directory under a name nobody can predict, never
    through a link, then renamed into place."""
    order = {"action": action.value, "id": secrets.token_hex(8), **more}
    temp = os.path.join(directory, f".order.{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, json.dumps(order).encode())
    finally:
        os.close(fd)
    os.replace(temp, os.path.join(directory, "order.json"))


def pool_of(directory: str | None, pids: Iterable[int], scale: int = 1) -> int:
    """Bytes of pinned host memory the job's processes keep from their last suspend (a pool), as each says
    (``<pid>.pool``), but never more than each holds resident (times ``scale``: the fake fast path's host
    memory is its bytes moved scaled down, ``fastmove_fake.SCALE``): a job's word alone buys no room."""
    if directory is None:
        return 0
    kept = 0
    for pid in pids:
        said = _pool_said(directory, pid)
        if said > 0:
            kept += min(said, resident(pid) * scale)
    return kept


def _pool_said(directory: str, pid: int) -> int:
    said = (_job_file(pool_file(directory, pid), 4096) or {}).get("bytes")
    return said if isinstance(said, int) and not isinstance(said, bool) else 0


def give_back(directory: str | None, pids: Iterable[int]) -> list[int]:
    """Tell the job's processes that keep a pool to give it back (``Order.DROP``): each unpins it beside its
    work and then says so in its pool file. The processes told."""
    if directory is None:
        return []
    told = [pid for pid in pids if _pool_said(directory, pid) > 0 and catches(pid, SUSPEND_SIGNAL)]
    if told:
        _order(directory, Order.DROP)
    for pid in told:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, SUSPEND_SIGNAL)
    return told


def release(members: list[int], cuda: set[int], directory: str | None, gpu_bytes: int) -> Released:
    """Ask every process of the job (``members``) that catches the request to release its memory, and wait for
    each. The answers of the processes the driver knows as CUDA ones (``cuda``) decide: one that did not
    release sends the job the driver's way; another process's "not applicable" (a launcher script with no
    torch) does not, and an MPS client, which the driver may not list, counts by its own answer. A process
    that released already (a helper run again after a crash) is not asked twice."""
    asked = [pid for pid in members if directory and catches(pid, SUSPEND_SIGNAL)]
    if not asked or directory is None:
        return Released(Path.DRIVER, Fallback.NOT_ASKED, "", {})
    for pid in asked:  # a refusal from an earlier suspend is no answer to this one (torch may be up now)
        if (_answer(directory, pid, "released") or {"ok": True}).get("ok") is False:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, f"{pid}.released"))
    waiting = [pid for pid in asked if _answer(directory, pid, "released") is None]
    if waiting:
        _order(directory, Order.SUSPEND)
    for pid in waiting:
        try:
            os.kill(pid, SUSPEND_SIGNAL)
        except ProcessLookupError:
            continue
    answers = {pid: a for pid in asked if (a := _answer(directory, pid, "released")) is not None}
    answers |= _wait(directory, waiting, "released", ANSWER_BASE + gpu_bytes / ANSWER_RATE)
    unanswered = [pid for pid in asked if pid in cuda and pid not in answers]
    if unanswered:
        return Released(Path.DRIVER, Fallback.NO_ANSWER, f"process {unanswered[0]}", answers)
    refused = [a for pid, a in answers.items() if not a.get("ok") and (pid in cuda or a.get("applies") is not False)]
    released = [a for a in answers.values() if a.get("ok")]
    if refused or not released:
        said = (refused or [a for a in answers.values() if not a.get("ok")] or [{}])[0]
        fallback = Fallback.NOT_APPLICABLE if said.get("applies") is False else Fallback.FAILED
        if not said:
            fallback = Fallback.NOT_ASKED
        return Released(Path.DRIVER, fallback, str(said.get("why") or "")[:300], answers)
    return Released(Path.FAST, None, "", answers)


def restore(pids: list[int], directory: str | None, keep: bool = False) -> int:
    """Ask every process that released its memory (its ``released`` file says so) to bring it back, and wait
    for each; OSError if one says it could not or does not answer. ``keep``: hold the pinned host memory
    for the next suspend (the daemon's word on the host's room, ``daemon.suspension.pools``). The bytes kept so."""
    if directory is None:
        return 0
    held = [pid for pid in pids if (_answer(directory, pid, "released") or {}).get("ok")]
    if held:
        _order(directory, Order.RESUME, keep=keep)
    for pid in held:
        try:
            os.kill(pid, RESUME_SIGNAL)
        except ProcessLookupError:
            continue
    answers = _wait(directory, held, "restored", ANSWER_BASE + 600.0)
    for pid in held:
        answer = answers.get(pid)
        if answer is None:
            raise OSError(f"process {pid} did not say its memory is back")
        if not answer.get("ok"):
            raise OSError(f"process {pid} could not bring its memory back: {answer.get('why')}")
    return sum(_pool_said(directory, pid) for pid in held)

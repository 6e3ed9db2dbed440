"""What holds a job's processes together, so that all of them end with it (docs/containment.md).

A job is a cgroup v2 (``<base>/gpuq-<key>/job-<id>``) where gpuq can make one: whatever a process of the job
does to its session, process group or environment, the kernel keeps it in the job's cgroup (or below), and
``cgroup.kill`` ends them all. ``<key>`` comes from the state directory's real path, so two queues on one machine
never share a cgroup and a restarted daemon finds the cgroups of the jobs it adopts where the last made them.
``<base>``:

- a root daemon (a shared queue): the hierarchy's root, under systemd too. The jobs are the machine's, not
  the daemon's unit's: they outlive a restart of the daemon (``KillMode=process``), and a cgroup beside the
  unit's, not inside it, is never in the way of systemd putting the next daemon into the unit's cgroup
  (which, with controllers handed down inside it, the no-internal-processes rule would refuse);
- a user's daemon: its own cgroup, which must be delegated to the user (``systemd-run --user --scope -p
  Delegate=yes``): it may only make cgroups below its own.

Where none can be had (no cgroup2, no delegation, ``GPUQ_CONTAINMENT=fallback``), a job is its session,
its process group and a marker in the environment of every process it starts (``GPUQ_JOB_MARKER``), found
through /proc: a process that leaves all three escapes, and the docs say so.

The cpu, memory and pids controllers, where the base can hand them down, enforce ``--cpus``, ``--ram`` and
``--pids`` (``launcher.supervisor.limits``).
cgroup v2 lets a cgroup with processes in it hand down no controller ("no internal processes"): a daemon
that sits in its base moves itself into ``gpuq-<key>/daemon`` first, and its shims, forked from it, start
there. A shim starts its job's first process inside the job's cgroup (``launcher.supervisor.intocgroup``; where
that cannot be done, it enters the cgroup to start the job and leaves: ``enter``/``leave``), so the job has
no moment outside, and the shim, which outlives the daemon, is never one of the processes a job's end kills.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpuq_scheduler.launcher.supervisor import cgroupfs, limits, marked, waiter

MARKER = marked.MARKER
FORCE = "GPUQ_CONTAINMENT"  # "fallback": do without cgroups even where they could be had (tests, odd setups)
CGROUP, FALLBACK = "cgroup", "fallback"
LIMITS = limits.LIMITS  # the controllers --cpus, --ram and --pids need
_GONE_WITHIN = 5.0  # seconds for killed processes to leave the cgroup before it is given up on


@dataclass(frozen=True)
class Containment:
    """How this queue contains its jobs: a cgroup per job under ``group``, or the fallback (``why``)."""

    kind: str
    key: str
    group: str = ""  # <base>/gpuq-<key>: the jobs' cgroups are made in it
    why: str = ""  # the fallback's reason
    controllers: tuple[str, ...] = ()  # of LIMITS, those the jobs' cgroups have
    limits_why: str = ""  # why --cpus, --ram or --pids cannot be enforced here, if one cannot

    def sweep(self, running: set[int]) -> None:
        """Remove the empty cgroups of jobs not running (their shims were killed before they could), never
        a running job's: its shim may be about to enter it."""
        with contextlib.suppress(OSError):
            for name in os.listdir(self.group or "/nonexistent"):
                if name.startswith("job-") and name[4:].isdigit() and int(name[4:]) not in running:
                    with contextlib.suppress(OSError):  # EBUSY: processes still in it (doctor names them)
                        os.rmdir(f"{self.group}/{name}")

    def close(self, running: set[int]) -> None:
        """Sweep, then remove the queue's cgroup if nothing is left in it (the next daemon makes it again)."""
        self.sweep(running)
        if self.group:
            with contextlib.suppress(OSError):
                os.rmdir(self.group)

    def box(self, job_id: int, cpus: float | None = None, ram: int | None = None, pids: int | None = None) -> Box:
        cgroup = f"{self.group}/job-{job_id}" if self.kind == CGROUP else None
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - 1.0  # a tick's rounding, and then some
        return Box(f"{self.key}/{job_id}", cgroup, cpus, ram, since, pids)

    def describe(self) -> str:
        """One line for `gpuq gpus` and `gpuq doctor`."""
        if self.kind != CGROUP:
            return f"fallback: process group + session + marker, because {self.why}"
        have = ", ".join(self.controllers) if self.controllers else "none"
        text = f"cgroup v2 at {self.group}; host limits (--cpus, --ram, --pids): {have}"
        text += f" ({self.limits_why})" if self.limits_why and len(self.controllers) < len(LIMITS) else ""
        unlimited = "; no process limit: a fork bomb in a job reaches the host"
        return text + ("" if "pids" in self.controllers else unlimited)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "key": self.key,
            "group": self.group,
            "why": self.why,
            "controllers": list(self.controllers),
            "limits_why": self.limits_why,
            "text": self.describe(),
        }


@dataclass(frozen=True)
class Box:
    """One job's containment, as its shim and, if the shim dies, the daemon use it."""

    marker: str
    cgroup: str | None  # None: the fallback
    cpus: float | None = None
    ram: int | None = None
    since: float = 0.0  # seconds since boot when it was made: every process of the job is younger
    pids: int | None = None  # pids.max: the most tasks (threads too) the job may hold at once

    def to_json(self) -> dict[str, object]:
        return {"marker": self.marker, "cgroup": self.cgroup, "since": self.since}

    @classmethod
    def from_json(cls, data: object) -> Box | None:
        if not isinstance(data, dict) or not isinstance(data.get("marker"), str):
            return None
        cgroup, since = data.get("cgroup"), data.get("since")
        since = float(since) if isinstance(since, int | float) and not isinstance(since, bool) else 0.0
        return cls(data["marker"], cgroup if isinstance(cgroup, str) else None, since=since)


def queue_key(root: str | os.PathLike[str]) -> str:
    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:12]


def cgroup2_mount(mounts: str = "/proc/self/mounts") -> str | None:
    """Where the cgroup v2 hierarchy is mounted (the first one listed), or None."""
    with contextlib.suppress(OSError), open(mounts) as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return fields[1].replace("\\040", " ")
    return None


@functools.cache
def _mount() -> str | None:
    return cgroup2_mount()


def own_cgroup(pid: int | str = "self") -> str | None:
    """A process's cgroup v2 path ("/..."), from its "0::" line in /proc/<pid>/cgroup."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup") as handle:
        for line in handle:
            if line.startswith("0::"):
                return line[3:].strip()
    return None


def open_for(root: str | os.PathLike[str], environ: Mapping[str, str]) -> Containment:
    """Decide, once at the daemon's start, how this queue contains its jobs, and make what that needs."""
    key = queue_key(root)
    if environ.get(FORCE, "").lower() == FALLBACK:
        return Containment(FALLBACK, key, why=f"{FORCE}=fallback is set")
    mount = cgroup2_mount()
    own = own_cgroup()
    if mount is None or own is None:
        return Containment(FALLBACK, key, why="no cgroup v2 hierarchy is mounted here")
    inside = os.geteuid() != 0
    base = os.path.normpath(mount + own) if inside else mount
    group = f"{base}/gpuq-{key}"
    try:
        os.makedirs(group, exist_ok=True)
        with open(f"{group}/cgroup.procs", "a"):
            pass  # writable: ours to move processes into
    except OSError as err:
        hint = "its cgroup is not delegated to this user" if inside else "it cannot be written"
        return Containment(FALLBACK, key, why=f"no cgroup can be made under {base} ({hint}: {err.strerror})")
    controllers, limits_why = limits.hand_down(base, group, inside)
    return Containment(CGROUP, key, group=group, controllers=controllers, limits_why=limits_why)


# -- a job's life, from its shim ---------------------------------------------------------------------------


def make(box: Box) -> None:
    """Make the job's cgroup afresh, with its limits. OSError if it cannot be made."""
    assert box.cgroup is not None
    if os.path.isdir(box.cgroup):  # an earlier attempt's: none of its processes or limits may join this run
        end(box, -1)
    os.makedirs(box.cgroup, exist_ok=True)  # the queue's own too, if a daemon that stopped just now removed it
    limit(box)


def limit(box: Box) -> None:
    """Set the job's limits on its cgroup (made already). OSError if they cannot be set."""
    assert box.cgroup is not None
    limits.apply(box.cgroup, box.cpus, box.ram, box.pids)


def enter(box: Box) -> str:
    """Move this process (the shim) into the job's cgroup, made already (``make``), so that what it spawns
    next is born there: the cgroup to go back to (``leave``). OSError if it cannot be entered. Only where a
    process cannot be cloned into the cgroup (``intocgroup``): each move waits for the kernel."""
    assert box.cgroup is not None
    back, mount = own_cgroup(), _mount()
    if back is None or mount is None:
        raise OSError("this process is in no cgroup v2 cgroup")
    cgroupfs.write(f"{box.cgroup}/cgroup.procs", str(os.getpid()))
    return os.path.normpath(mount + back)


def leave(back: str | None) -> None:
    if back is not None:
        cgroupfs.write(f"{back}/cgroup.procs", str(os.getpid()))


def signal_all(box: Box | None, leader: int, signum: int) -> None:
    """Send ``signum`` to every process of the job: the group of its first process and, contained, every
    process in its cgroup (or, in the fallback, every one found by session or marker)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)
    if box is None:
        return
    if box.cgroup is not None and signum == signal.SIGKILL:
        with contextlib.suppress(OSError):
            cgroupfs.write(f"{box.cgroup}/cgroup.kill", "1")
        return
    for pid in members(box, leader):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def members(box: Box, leader: int) -> set[int]:
    """The job's live processes now."""
    if box.cgroup is not None:
        return {int(word) for word in cgroupfs.words(f"{box.cgroup}/cgroup.procs")} - {os.getpid()}
    return marked.find(box.marker, leader, box.since)


def end(box: Box | None, leader: int, settle: float = 0.0, remove: bool = True) -> dict[str, object]:
    """End every process left of the job once its first process has exited, and remove its cgroup: the facts
    for the exit file's ``contained`` field (``outlived``: how many processes had to be ended; from a cgroup
    also what its limits held it to (``limits.reached``) and ``cpu_seconds``, ``peak_ram`` where the kernel
    accounts them). ``settle``: gpuq
    signalled all of the job's processes (a cancel, its time limit), so those on their way out are given this
    long to go by themselves and are not counted as outliving it. On return no process of the job is left,
    not even one on its way out (the kernel counts a process in its cgroup until it has let go of its memory
    and files, GPU memory too), unless one could not end within ``_GONE_WITHIN``. ``remove=False`` leaves the
    empty cgroup to ``discard``: a successor need not wait for the rmdir."""
    if box is None:
        return {}
    populated = box.cgroup is None or _populated(box.cgroup)  # in a cgroup, as a rule not once the first is reaped
    deadline, left = time.monotonic() + settle, set[int]()
    if populated and (settle or box.cgroup is not None):  # the fallback's kill below finds them itself
        left = members(box, leader)
        while left and time.monotonic() < deadline:
            time.sleep(0.01)
            left = members(box, leader)
    if box.cgroup is None:
        return {"outlived": marked.kill(box.marker, leader, box.since, _GONE_WITHIN)}
    facts: dict[str, object] = {"outlived": len(left), **limits.reached(box.cgroup, box.ram, box.pids)}
    if populated:  # then all go: those counted, those on their way out, and any in cgroups made below it
        with contextlib.suppress(OSError):
            cgroupfs.write(f"{box.cgroup}/cgroup.kill", "1")
        _wait_empty(box.cgroup)  # also for processes past cgroup.procs (exiting) but still holding memory
    facts.update(limits.usage(box.cgroup))
    if remove:
        discard(box)
    return facts


def discard(box: Box | None) -> None:
    """Remove a job's cgroup, emptied by ``end`` (bounded: EBUSY while a killed process is on its way out)."""
    deadline = time.monotonic() + _GONE_WITHIN
    while box is not None and box.cgroup is not None:
        try:
            for below, _, _ in os.walk(box.cgroup, topdown=False):  # cgroups the job made below its own first
                os.rmdir(below)
            return None
        except FileNotFoundError:
            return None
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


def _populated(cgroup: str) -> bool:
    return bool(cgroupfs.keyed(f"{cgroup}/cgroup.events").get("populated"))


def _wait_empty(cgroup: str) -> None:
    """Wait (bounded) until no process is left in ``cgroup``."""
    deadline = time.monotonic() + _GONE_WITHIN
    while _populated(cgroup) and time.monotonic() < deadline:
        time.sleep(0.005)


def job_of(pid: int, group: str) -> int | None:
    """The job whose cgroup (in the queue's cgroup ``group``) holds process ``pid``, whatever its ancestry,
    session or environment: how a process on a GPU is known to be a job's. None: no job's of this queue."""
    mount, inside = _mount(), own_cgroup(pid)
    if not group or mount is None or inside is None:
        return None
    parent, _, leaf = os.path.normpath(mount + inside).rpartition("/")
    if parent != group or not leaf.startswith("job-") or not leaf[4:].isdigit():
        return None
    return int(leaf[4:])


def occupied(group: str) -> dict[int, int]:
    """The jobs of ``group`` with processes in their cgroups, and how many; waiters (nothing run yet) not counted."""
    found = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(group):
            if name.startswith("job-") and name[4:].isdigit():
                count = sum(not waiter.is_waiter(pid) for pid in cgroupfs.words(f"{group}/{name}/cgroup.procs"))
                if count:
                    found[int(name[4:])] = count
    return found


def read_record(path: str) -> Containment | None:
    """The containment a daemon recorded in gpus.json (``launcher.daemon.state``), for `gpuq gpus`/doctor."""
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read()).get("containment")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(data, dict) or data.get("kind") not in (CGROUP, FALLBACK):
        return None
    return Containment(
        str(data["kind"]),
        str(data.get("key", "")),
        str(data.get("group", "")),
        str(data.get("why", "")),
        tuple(str(c) for c in data.get("controllers", []) if c in LIMITS),
        str(data.get("limits_why", "")),
    )

"""Fair share in a shared queue: the order in which pending jobs of several users go to placement.
Pure: plain values in, plain values out; no clock, no I/O.

**Usage.** Each user's recent GPU use is GPU-seconds that halve every ``half_life`` (``decayed``): a run of
``gpus`` GPUs from ``started`` to ``ended`` counts ``gpus * (ended - started)``, decayed from its end. A
``Usage`` holds these sums at one time; the daemon builds it once from history (``Usage.from_history``) and
then charges each job as it ends (``charge``), so it never re-reads history. Running jobs are not stored:
their time so far (``gpus * (now - started)``) is added when the queue is ordered (``recent_use``). Dating
a whole run at its end keeps a user's use from jumping when a job ends (its time so far, undecayed, becomes
the same amount, charged); it forgets a long run's first hours a little late, which only errs toward
fairness for the others.

**Order** (``fair_order``), one job at a time, picking the next job's user by:

1. Admin-set user priority, higher first (``[shared.priority]``, default 0): an admin's word beats history.
2. Lowest *projected load*: recent use + ``CHARGE`` x (GPUs the user holds now + GPUs of that user's jobs
   already put ahead in this order). Recent use alone changes only as time passes, so within one pass the
   user with the least history would get every free GPU; charging each GPU held or about to be held as
   ``CHARGE`` of use makes two users with equal history alternate, and a user with 31 GPU-hours of history
   wait until the other's projected load catches up. CPU jobs (``gpus == 0``) charge nothing.
3. Ties: the user whose next job has the lowest id.

Within one user, jobs go by their own ``--priority`` (higher first), then id. So ``--priority`` orders a
user's own jobs and never jumps other users' (it would otherwise be a way to cut in line); with one user
the order is exactly the single-user order ``(-priority, id)``. Each user's jobs are sorted once and the
users merged through a heap: O(n log n) to sort, O(n log users) to merge.

The order only decides who is considered first; placement still skips what cannot start (a user over
their cap waits there without claiming GPUs). How two users' jobs interleave depends on those two users
alone, so a capped user's jobs early in the order do not change how the others' interleave.

``why_behind`` words the reason for a job that waits behind other users' jobs: the admin priority that put
them first, or each side's recent GPU-hours ("fair-share: alice used 31.0 GPU-h recently (bob 2.0)").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

HOUR = 3600.0
# What one GPU held now (or about to be) counts as, in GPU-seconds: an hour of use. Without it a pass
# would give every free GPU to the user with the least history; with it a difference in history of under
# an hour is evened out by one GPU, while a day's real use (tens of GPU-hours) still takes tens of GPUs.
CHARGE = 1 * HOUR

Queued = tuple[str, int, int, int]  # what fair_order needs of a pending job: (user, gpus, priority, job id)
Run = tuple[str, int, float]  # a running job: (user, gpus, started)
Ended = tuple[str, int, float, float]  # a finished run: (user, gpus, started, ended)

T = TypeVar("T")


def decayed(amount: float, age: float, half_life: float) -> float:
    """``amount`` after ``age`` seconds of halving every ``half_life`` seconds (a negative age counts as 0:
    an end time a little in the future, from a clock step back, must not grow the amount)."""
    return amount * math.pow(2.0, -max(age, 0.0) / half_life)


@dataclass(frozen=True)
class Usage:
    """Each user's decayed GPU-seconds, as of ``now``. Immutable: ``at`` and ``charge`` return new values."""

    half_life: float
    now: float = 0.0
    seconds: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.half_life > 0:
            raise ValueError(f"half_life must be positive, not {self.half_life}")

    @classmethod
    def from_history(cls, rows: Iterable[Ended], now: float, half_life: float) -> Usage:
        """From finished runs ``(user, gpus, started, ended)``. Runs that ended over ten half-lives ago add
        under 0.1% of their size, so the caller may leave them out."""
        seconds: dict[str, float] = {}
        for user, gpus, started, ended in rows:
            amount = decayed(gpus * max(ended - started, 0.0), now - ended, half_life)
            seconds[user] = seconds.get(user, 0.0) + amount
        return cls(half_life, now, seconds)

    def at(self, now: float) -> Usage:
        """The same usage seen at ``now``; never moved backwards (a clock step back leaves it as it is)."""
        if now <= self.now:
            return self
        return Usage(
            self.half_life, now, {u: decayed(s, now - self.now, self.half_life) for u, s in self.seconds.items()}
        )

    def charge(self, user: str, gpus: int, started: float, ended: float, now: float) -> Usage:
        """Add a run that just ended: ``gpus * (ended - started)`` GPU-seconds, decayed from ``ended``."""
        base = self.at(now)
        amount = decayed(gpus * max(ended - started, 0.0), base.now - ended, self.half_life)
        return Usage(self.half_life, base.now, {**base.seconds, user: base.seconds.get(user, 0.0) + amount})

    def of(self, user: str) -> float:
        """The user's decayed GPU-seconds as of ``self.now``."""
        return self.seconds.get(user, 0.0)


def recent_use(usage: Usage, running: Iterable[Run], now: float) -> dict[str, float]:
    """Each user's recent GPU-seconds at ``now``: decayed past runs plus running jobs' time so far."""
    used = dict(usage.at(now).seconds)
    for user, gpus, started in running:
        used[user] = used.get(user, 0.0) + gpus * max(now - started, 0.0)
    return used


def held_gpus(running: Iterable[Run]) -> dict[str, int]:
    """GPUs each user's running jobs hold now (``place``'s ``user_gpus``, ``fair_order``'s ``held``)."""
    held: dict[str, int] = {}
    for user, gpus, _ in running:
        held[user] = held.get(user, 0) + gpus
    return held


def fair_order(
    jobs: Iterable[T],
    key: Callable[[T], Queued],
    *,
    used: Mapping[str, float],
    held: Mapping[str, int],
    user_priority: Mapping[str, int] | None = None,
) -> list[T]:
    """The pending ``jobs`` in the order placement should consider them (see the module docstring).

    ``key(job)`` gives ``(user, gpus, priority, job id)``; ``used`` is ``recent_use(...)`` in GPU-seconds,
    ``held`` the GPUs each user holds now, ``user_priority`` the admin-set priorities (missing: 0).
    """
    items = jobs if isinstance(jobs, list) else list(jobs)
    queues: dict[str, list[tuple[int, int, int, int]]] = {}  # user -> [(-priority, id, gpus, index)]
    for index, (user, gpus, priority, job_id) in enumerate(map(key, items)):
        queue = queues.get(user)
        if queue is None:
            queue = queues[user] = []
        queue.append((-priority, job_id, gpus, index))
    if len(queues) <= 1:
        return [items[entry[3]] for queue in queues.values() for entry in sorted(queue)]
    priorities = user_priority or {}
    lists: list[list[tuple[int, int, int, int]]] = []
    # One heap entry per user with jobs left: (-user priority, projected load, next job's id, user's slot).
    heap: list[tuple[int, float, int, int]] = []
    for slot, (user, queue) in enumerate(queues.items()):
        queue.sort()
        lists.append(queue)
        heap.append((-priorities.get(user, 0), used.get(user, 0.0) + CHARGE * held.get(user, 0), queue[0][1], slot))
    heapq.heapify(heap)
    taken = [0] * len(lists)
    order: list[T] = []
    # The loop runs once per job: local names keep it at a few hundred nanoseconds a job.
    append, heapreplace, heappop = order.append, heapq.heapreplace, heapq.heappop
    while heap:
        rank, load, _, slot = heap[0]
        queue, at = lists[slot], taken[slot]
        _, _, gpus, index = queue[at]
        append(items[index])
        at += 1
        if at == len(queue):
            heappop(heap)
        else:
            taken[slot] = at
            heapreplace(heap, (rank, load + CHARGE * gpus, queue[at][1], slot))
    return order


def why_behind(
    user: str, ahead: Iterable[str], used: Mapping[str, float], user_priority: Mapping[str, int] | None = None
) -> str | None:
    """Why a job of ``user`` waits while jobs of the users ``ahead`` went first; None if all are ``user``'s.

    One short line: the admin priority that put another user first, else each side's recent GPU-hours.
    """
    others = sorted({other for other in ahead if other != user})
    if not others:
        return None
    priorities = user_priority or {}
    mine = priorities.get(user, 0)
    above = [other for other in others if priorities.get(other, 0) > mine]
    if above:
        top = max(above, key=lambda other: priorities.get(other, 0))
        return f"user priority: {top} ({priorities.get(top, 0)}) goes before {user} ({mine})"
    shown = sorted(others, key=lambda other: (used.get(other, 0.0), other))[:3]
    listed = ", ".join(f"{other} {_hours(used, other)}" for other in shown)
    more = f", {len(others) - len(shown)} more" if len(others) > len(shown) else ""
    return f"fair-share: {user} used {_hours(used, user)} GPU-h recently ({listed}{more})"


def _hours(used: Mapping[str, float], user: str) -> str:
    return f"{used.get(user, 0.0) / HOUR:.1f}"


def explain(
    waiting: Mapping[int, str],
    order: Sequence[T],
    key: Callable[[T], tuple[str, int, int, int]],
    used: Mapping[str, float],
    user_priority: Mapping[str, int] | None = None,
) -> dict[int, str]:
    """The reasons of ``waiting`` that fair share explains further: a job waiting for GPUs while other
    users' jobs went before it in the fair-share ``order`` (``key`` gives an item's user, GPUs, priority,
    id, as for ``fair_order``). Returns only the reasons it changed."""
    changed: dict[int, str] = {}
    if len({key(item)[0] for item in order}) < 2:
        return changed
    ahead: set[str] = set()
    said: dict[tuple[str, frozenset[str]], str | None] = {}
    for item in order:
        user, gpus, _, job_id = key(item)
        why = waiting.get(job_id, "")
        if why.startswith(("waiting for", "held back")) and "could ever" not in why:
            memo = (user, frozenset(ahead))
            if memo not in said:
                said[memo] = why_behind(user, ahead, used, user_priority)
            if said[memo]:
                changed[job_id] = f"{why}; {said[memo]}"
        if gpus:
            ahead.add(user)
    return changed

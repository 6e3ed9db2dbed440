"""Every request checked whole before it can reach the table (STYLE.md 11).

``spool.read_request`` types what a user wrote, then holds each request, through this module, to the rules the
client holds a submit to (``jobs.rules``, the same functions and words), plus what only a hand-written file
can get wrong: every string free of NUL and valid UTF-8, every number inside the bounds SQLite, a sleep and
a timestamp can hold, arrays no larger than one transaction should be, and no field a user may not set
(``kind`` and ``mem_from`` are the daemon's: ``kind`` is recomputed from the command, so a request cannot
file its peak under someone else's). What fails raises BadInput with a one-line reason; the spool makes it a
``BadRequest``, which the daemon sets aside: it never reaches the table, where it would fail every pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.options import kept_options
from gpuq_scheduler.jobs.rules import MAX_ARRAY, check_array, check_bounds, check_text, check_texts
from gpuq_scheduler.jobs.store import action_values
from gpuq_scheduler.jobs.store.action_values import ActionValues
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.submission import kind_of

MAX_ID = (1 << 63) - 1  # SQLite's largest integer
MAX_IDS = MAX_ARRAY + 1  # ids one cancel or control names: an array and all its members, at most
MAX_PID = 1 << 22  # Linux's pid_max ceiling (an interactive job's client)
LATEST = 1 << 33  # a submit time past this (year 2242) is not a clock's; readers could not render it


def submit(spec: JobSpec, submitted_at: float, indices: Sequence[int] | None, throttle: int | None) -> JobSpec:
    """A submit's spec as the daemon may queue it (its own fields set), or BadInput saying what is wrong."""
    check_bounds(gpus=spec.gpus, retries=spec.retries, time_limit=spec.time_limit, after=spec.after)
    check_texts(
        command=spec.command, cwd=spec.cwd, env=spec.env, name=spec.name, notify=spec.notify, python=spec.python
    )
    if spec.like is not None and not 0 < spec.like <= MAX_ID:
        raise BadInput(f"--like takes a job id, which is a positive number, not {spec.like}")
    if spec.client is not None and not 0 < spec.client < MAX_PID:
        raise BadInput("names a client process that cannot exist")
    if not 0 <= submitted_at < LATEST:
        raise BadInput("has a submit time no clock gives")
    if indices is not None:
        check_array(indices, throttle)
    for option in kept_options():  # each option's own check, as the client's capture_spec made it
        if option.capture is not None:
            option.kept(spec.value(option))
    _numbers({key: value for key, value in spec.to_json().items() if key not in _TEXTS}, "the job spec")
    # The daemon's fields, whatever the request says: kind is what --mem auto files peaks under. The client
    # computed the same (a replace costs 11 us, and every submit to an idle queue waits for this check).
    kind = kind_of(spec.command, spec.cwd)
    return spec if spec.kind == kind and not spec.mem_from else dataclasses.replace(spec, kind=kind, mem_from="")


def ids(named: Sequence[int]) -> None:
    """The ids a cancel or control names: how many (each is checked as an id when read)."""
    if len(named) > MAX_IDS:
        raise BadInput(f"names {len(named)} jobs; one request may name at most {MAX_IDS}")


def control(action: Action, named: Sequence[int], values: Mapping[str, Any]) -> ActionValues | None:
    """A control request's ids, and its values read as the type its action carries (``jobs.store.action_values``):
    only `update`, `reserve` and `unreserve` carry any, and only what they may."""
    ids(named)
    if action.on_reservations and named:  # a reservation's values say what it is; it names no job or GPU
        raise BadInput(f"names jobs or GPUs in {action}, which takes none")
    return action_values.read(action, values)


_TEXTS = frozenset({"command", "cwd", "env", "name", "notify", "python"})  # check_texts's, named as the user gave them


def _numbers(value: Any, where: str) -> None:
    """Every number SQLite's 64-bit integers and a float can hold, every string checked, at any depth: a walk
    without recursion, an ASCII string without a call (a submit's environment is most of it, and every submit
    is checked so in the daemon's intake)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is str:
            if "\0" in item or not item.isascii():
                check_text(where, item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -MAX_ID - 1 <= item <= MAX_ID:
                raise BadInput(f"holds a number in {where} larger than any gpuq keeps")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise BadInput(f"holds a number in {where} that is not finite")
        elif isinstance(item, str):
            check_text(where, item)
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)

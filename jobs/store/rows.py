"""A job's record as a row of the job table and back (``schema`` is the table's layout and its migrations):
each field of ``JobRecord`` is kept in the column of its name, written and read by its type, and rows are
read by their columns' names, so a field needs no code of its own here."""

from __future__ import annotations

import dataclasses
import enum
import json
import sqlite3
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from gpuq_scheduler.jobs import plain
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.store.schema import LISTED

# What a JobRecord is read from: each of its fields from the jobs row's column of the same name, written and read
# by its type (tuples as JSON text, enums as their values, booleans as 0 or 1), except those kept elsewhere: the
# spec (its own columns: ``spec``, ``env`` and the LISTED copies), what its cgroup accounted (``host_usage``),
# where a cluster ran it (``clusters.db``) and the energy charged to it (``energy``). A table of an older
# version lacks some columns: a record read from it holds those fields' defaults.
ELSEWHERE = frozenset({"spec", "cpu_seconds", "peak_ram", "cluster", "external_id", "node", "energy"})
RECORD_COLUMNS = tuple(name for name in plain.hints(JobRecord) if name not in ELSEWHERE)


def column_reader(hint: Any, default: Any) -> Callable[[Any], Any] | None:
    """How a column of a field of type ``hint`` becomes the field's value (NULL: ``default`` where the field
    is not optional and has one); None where the column holds the value as it is. Made once per field: a
    pass reads 10,000 pending records."""
    optional = plain.optional_of(hint)
    kind = hint if optional is None else optional
    fallback = default if optional is None and default is not dataclasses.MISSING else None
    if typing.get_origin(kind) is tuple:
        read = plain.reader(kind, "column")
        return lambda value: fallback if value is None else () if value == "[]" else read(json.loads(value))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        members = {member.value: member for member in kind}  # Enum(value) costs a microsecond a row
        return lambda value: fallback if value is None else members.get(value) or kind(value)
    if kind is bool:
        return lambda value: fallback if value is None else bool(value)
    if fallback is not None:
        return lambda value: fallback if value is None else value
    return None


def read_fields(
    rows: Sequence[sqlite3.Row], readers: Mapping[str, Callable[[Any], Any] | None]
) -> Iterator[dict[str, Any]]:
    """The fields ``readers`` names that each of ``rows`` (of one query) holds, by column name, read as their
    types; other columns (the spec, a launch's) are left to the caller. Where each column is, is found once
    from the first row's names: a per-row look-up by name cost the daemon's start a third more."""
    if not rows:
        return
    plan = [(at, name, readers[name]) for at, name in enumerate(rows[0].keys()) if name in readers]
    for row in rows:
        yield {name: row[at] if read is None else read(row[at]) for at, name, read in plan}


def to_column(value: Any) -> Any:
    """A field's value as its column holds it (the inverse of ``column_reader``)."""
    if isinstance(value, tuple):
        return json.dumps(list(value))
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool):
        return int(value)
    return value


_DEFAULTS = {field.name: plain.default(field) for field in dataclasses.fields(JobRecord)}


def record_readers(names: Iterable[str]) -> dict[str, Callable[[Any], Any] | None]:
    """A ``column_reader`` for each field of JobRecord named (``clusters.db`` keeps others than jobs.db)."""
    hints = plain.hints(JobRecord)
    return {name: column_reader(hints[name], _DEFAULTS[name]) for name in names}


READERS = record_readers(RECORD_COLUMNS)


def columns_of(db: sqlite3.Connection, table: str) -> frozenset[str]:
    """The columns ``table`` has (an older version's table lacks the newer ones)."""
    return frozenset(row[1] for row in db.execute(f"PRAGMA table_info({table})"))


def record_select(present: frozenset[str]) -> str:
    """The select list a record is read from (``record_from``), of the columns a table has; qualified, as
    ``arrays`` (``JOINED``) has columns of the same names."""
    return ", ".join([*(f"jobs.{name} AS {name}" for name in RECORD_COLUMNS if name in present), "jobs.spec AS spec"])


def spec_row(spec: JobSpec) -> tuple[Any, ...]:
    """The spec's column and its LISTED copies, in that order."""
    data = spec.to_json()
    del data["env"]  # kept in its own column: listings never parse environments
    name = spec.default_name  # the "program" column holds what a job without a --name is called
    return (json.dumps(data), spec.name, name, spec.gpus, spec.mem_per_gpu, spec.mem_auto, spec.mem_from)


SPEC_COLUMNS = ", ".join(["spec", *(column for column, _, _ in LISTED)])  # spec_row's columns...
SPEC_VALUES = ", ".join("?" * (1 + len(LISTED)))  # ...and a placeholder for each


def records_from(
    rows: Sequence[sqlite3.Row], *, with_env: bool = False, envs: dict[str, Mapping[str, str]] | None = None
) -> list[JobRecord]:
    """The records rows of one query by ``record_select``'s list hold (read by name; other columns are
    ignored). ``with_env``: each row's ``job_env`` column is its environment's JSON text (else none is read);
    ``envs``: environments parsed already, by their text (10,000 members of one array share one)."""
    records: list[JobRecord] = []
    if not rows:
        return records
    names = rows[0].keys()
    spec_at, env_at = names.index("spec"), names.index("job_env") if with_env else None
    for row, fields in zip(rows, read_fields(rows, READERS), strict=True):
        spec_data = json.loads(row[spec_at])
        env = None if env_at is None else row[env_at]
        if envs is not None and env:
            if env not in envs:
                envs[env] = json.loads(env)
            spec_data["env"] = envs[env]
        else:
            spec_data["env"] = json.loads(env) if env else {}
        records.append(JobRecord(spec=JobSpec.from_json(spec_data), **fields))
    return records

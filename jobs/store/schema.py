"""The job table's layout: its SQL schema and version, and the migrations that bring an older table up to it
(``rows``: how a ``JobRecord`` becomes a row and back; ``table`` does the reading and writing)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.errors import StateDirError
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.jobs.store.statedir import TABLE_VERSION as TABLE_VERSION

# Version 2: what a listing shows of a job's spec, copied into columns of their own when the spec is written,
# so that `gpuq status --all` reads 100,000 jobs without parsing 100,000 specs with json_extract.
# (column, its type, the spec's field it copies).
LISTED = (
    ("name", "TEXT", "$.name"),
    ("program", "TEXT", "$.command[0]"),
    ("want_gpus", "INTEGER", "$.gpus"),
    ("mem_per_gpu", "INTEGER", "$.mem_per_gpu"),
    ("mem_auto", "INTEGER", "$.mem_auto"),
    ("mem_from", "TEXT", "$.mem_from"),
)

# Version 3: why a job ended, typed (``jobs.causes.Cause``), and for a victim of CUDA out of memory the job
# that took its memory. (column, its type)
CAUSED = (("cause", "TEXT"), ("culprit", "INTEGER"))

# Version 4: a job suspended to host memory (``gpuq suspend``): the step in progress (``jobs.outcome.Step``,
# NULL when none), the bytes of GPU state its processes hold in host memory while suspended, when the
# current suspension began (wall time, for records) and the seconds it spent suspended before (its time
# limit does not run then). (column, its type)
SUSPENSION = (("step", "TEXT"), ("host_bytes", "INTEGER"), ("suspended_at", "REAL"), ("suspended_for", "REAL"))

# A version-2 table gets its causes from what was recorded then, once, as the daemon migrates it: its
# state, exit code and signal, and for out of memory the words a version-2 daemon wrote (the one place a
# reason is read, since nothing else knows those runs).
_CAUSE_OF_V2 = f"""CASE
    WHEN state = 'succeeded' THEN '{Cause.SUCCEEDED.value}'
    WHEN state = 'cancelled' AND reason LIKE 'not run: %' THEN '{Cause.DEPENDENCY.value}'
    WHEN state = 'cancelled' THEN '{Cause.CANCELLED.value}'
    WHEN state = 'timeout' THEN '{Cause.TIME_LIMIT.value}'
    WHEN state = 'lost' AND reason LIKE 'GPU % was lost%' THEN '{Cause.GPU_LOST.value}'
    WHEN state = 'lost' THEN '{Cause.LOST.value}'
    WHEN reason LIKE 'CUDA out of memory at its % share (--mem %' THEN '{Cause.OOM_PAST_SHARE.value}'
    WHEN reason LIKE 'CUDA out of memory%' THEN '{Cause.OOM.value}'
    WHEN reason LIKE 'could not start: %' THEN '{Cause.FAILED_TO_SPAWN.value}'
    WHEN signal IS NOT NULL THEN '{Cause.SIGNAL.value}'
    WHEN exit_code IS NOT NULL THEN '{Cause.EXIT_CODE.value}'
    WHEN state = 'failed' THEN '{Cause.REJECTED.value}'
END"""

# ``intake``: a shared queue's daemon gives each submit (named by its token) an id; the pair is recorded with
# the job, in one transaction, so that a request a crash left in the spool keeps its id when read again.
# Version 5: everyone can read this table, and a token names a spool file (``spool/submit-<token>.json``):
# it keeps the token's SHA-256 (``digest``; 128 random bits cannot be found from it) and the uid that wrote
# the request, so that only the same user's re-send counts as one. Version 4 kept the token itself.
_INTAKE = """
CREATE TABLE IF NOT EXISTS intake (
    digest TEXT PRIMARY KEY,
    uid INTEGER NOT NULL,
    id INTEGER NOT NULL,
    at REAL NOT NULL
);
"""

# What --mem auto has learned: per kind of job (array:N, name:X, cmd:DIGEST), the most one of its jobs held
# on one GPU, and which job; ``raised`` marks a share doubled after an out-of-memory, not a measured peak.
# Added after table version 1 without a new version: the daemon creates it in an older table on opening.
LEARNED = """
CREATE TABLE IF NOT EXISTS learned (
    kind TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL,
    job_id INTEGER NOT NULL,
    raised INTEGER NOT NULL DEFAULT 0
);
"""

# What a job's cgroup accounted of its last run on the host (launcher.supervisor.containment): CPU seconds, and
# the most host memory it held where the memory controller is there. Added, like ``learned``, without a new
# version: the daemon creates it in an older table on opening, and a reader without it reads nothing.
HOST_USAGE = """
CREATE TABLE IF NOT EXISTS host_usage (
    job_id INTEGER PRIMARY KEY,
    cpu_seconds REAL,
    peak_ram INTEGER
);
"""


def states(*among: JobState) -> str:
    """The condition that a job is in one of these states, in SQL, its words made from the enum so that no
    query restates a state's value. Literals, not parameters: SQLite uses a partial index only for a query
    whose condition names its values."""
    values = ", ".join(literal(state) for state in among)
    return f"state = {values}" if len(among) == 1 else f"state IN ({values})"


def literal(state: JobState) -> str:
    return f"'{state.value}'"


# The jobs not finished, suspended ones included (SQLite uses a partial index only for a query that names
# its condition word for word: ``LIVE_STATES`` is that condition).
LIVE_STATES = states(JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)
LIVE = f"CREATE INDEX IF NOT EXISTS jobs_live ON jobs(state) WHERE {LIVE_STATES};\n"

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    state TEXT NOT NULL,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    priority INTEGER NOT NULL,
    spec TEXT NOT NULL,
    env TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    gpus TEXT NOT NULL DEFAULT '[]',
    gpu_uuids TEXT NOT NULL DEFAULT '[]',
    exit_code INTEGER,
    signal INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    peak_mem INTEGER,
    log TEXT NOT NULL DEFAULT '',
    shim_pid INTEGER,
    shim_start REAL,
    boot_id TEXT,
    port INTEGER,
    cancel_by TEXT,
    array_id INTEGER,
    array_index INTEGER,
    attempt INTEGER NOT NULL DEFAULT 1,
    held INTEGER NOT NULL DEFAULT 0,
    not_before REAL,
"""
    + ",\n".join(f"    {column} {kind}" for column, kind in [*((c, k) for c, k, _ in LISTED), *CAUSED, *SUSPENSION])
    + """
);
CREATE INDEX IF NOT EXISTS jobs_array ON jobs(array_id) WHERE array_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS arrays (
    id INTEGER PRIMARY KEY,
    uid INTEGER NOT NULL,
    user TEXT NOT NULL,
    name TEXT NOT NULL,
    size INTEGER NOT NULL,
    throttle INTEGER,
    env TEXT NOT NULL,
    notify TEXT,
    submitted_at REAL NOT NULL,
    notified INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
    + LEARNED
    + _INTAKE
    + HOST_USAGE
    + """
CREATE INDEX IF NOT EXISTS jobs_active ON jobs(state) WHERE state IN ('pending', 'running');
"""
    + LIVE
)

ENV = "COALESCE(NULLIF(jobs.env, ''), arrays.env, '{}')"
JOINED = "jobs LEFT JOIN arrays ON jobs.array_id = arrays.id"


def create_table(path: Path) -> None:
    """Build the table under a temp name and rename it in: a reader never sees a file without the schema."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")  # recorded in the file: every later connection uses WAL
        db.executescript(SCHEMA)
        db.execute(f"PRAGMA user_version={TABLE_VERSION}")
    finally:
        db.close()
    os.replace(tmp, path)


def _listed_copies(db: sqlite3.Connection) -> None:
    """Version 2: what a listing shows of a spec, copied into columns of their own (``LISTED``)."""
    for column, kind, _ in LISTED:
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
    copies = ", ".join(f"{column} = json_extract(spec, '{field}')" for column, _, field in LISTED)
    db.execute(f"UPDATE jobs SET {copies}")


def _typed_causes(db: sqlite3.Connection) -> None:
    """Version 3: why each job ended, typed (``CAUSED``), found from what version 2 recorded."""
    for column, kind in CAUSED:
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
    db.execute(f"UPDATE jobs SET cause = {_CAUSE_OF_V2} WHERE state NOT IN ('pending', 'running')")


def _suspension(db: sqlite3.Connection) -> None:
    """Version 4: jobs suspended to host memory (``SUSPENSION``), and the index of live jobs."""
    for column, kind in SUSPENSION:
        db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
    db.execute(LIVE)


# Each version's change, which brings a table of the version before it up to that version: ``migrate`` runs
# those past a table's version in order, in one transaction. A change of the schema is a new entry here (and
# its shape in SCHEMA, which makes new tables): tests/unit/test_stored_job.py checks that every version has one and
# that a table brought up from an old version has the shape of a table made new.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    2: _listed_copies,
    3: _typed_causes,
    4: _suspension,
    5: lambda db: _hide_tokens(db),  # defined below, beside ``token_digest``
}


def migrate(db: sqlite3.Connection, version: int) -> None:
    """Bring a table of an older version up to this one (the daemon does, on opening it), in one transaction."""
    if version >= TABLE_VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        for step in range(max(version, 1) + 1, TABLE_VERSION + 1):  # version 1 is the first
            MIGRATIONS[step](db)
        db.execute(f"PRAGMA user_version={TABLE_VERSION}")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    if version < 5:  # the plain tokens' old pages: out of the log and the file (zeroed by secure_delete)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def token_digest(token: str) -> str:
    """What the public table keeps of a submit's token: its SHA-256, which names no spool file."""
    return hashlib.sha256(token.encode()).hexdigest()


def _hide_tokens(db: sqlite3.Connection) -> None:
    """Version 4's ``intake`` (plain tokens) becomes version 5's (their digests, and the uid of the job each
    was given). ``secure_delete`` zeroes the freed pages, so no plain token is left in the file."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(intake)")}
    if "token" not in columns:
        return  # made in this version's shape (a table from before ``intake``)
    rows = db.execute(
        "SELECT intake.token, intake.id, intake.at, jobs.uid FROM intake LEFT JOIN jobs ON jobs.id = intake.id"
    ).fetchall()
    db.execute("PRAGMA secure_delete=ON")
    db.execute("DROP TABLE intake")
    db.execute(_INTAKE)  # not executescript, which would commit the migration half done
    # A token whose job is gone (none is: a job's row is never deleted) cannot be re-sent by anyone: uid -1.
    db.executemany(
        "INSERT OR IGNORE INTO intake (digest, uid, id, at) VALUES (?, ?, ?, ?)",
        [(token_digest(str(token)), -1 if uid is None else uid, job_id, at) for token, job_id, at, uid in rows],
    )


def connect(path: Path, *, create: bool = False) -> tuple[sqlite3.Connection, int]:
    """The job table at ``path``, opened (``create``: by the daemon, made or brought up to date first), and
    its version (a table no daemon of this version opened yet lacks the newer columns: its lines parse
    specs before version 2, and it has no causes before version 3). A missing table reads as an empty
    queue: nothing was ever submitted there."""
    if create and not path.exists():
        create_table(path)
    if not path.exists():
        db = sqlite3.connect(":memory:", isolation_level=None)
        db.executescript(SCHEMA)
        return db, TABLE_VERSION
    try:
        db, version = _open(path, create)
        if version > TABLE_VERSION:
            raise StateDirError(
                f"{path} was written by a newer gpuq (table version {version}); upgrade gpuq to read it"
            )
        if create:  # the daemon: a table from before --mem auto gets its (empty) record of peaks
            db.execute("PRAGMA journal_mode=WAL")  # left in rollback mode by a clean stop (JobTable.close)
            db.executescript(LEARNED + _INTAKE + HOST_USAGE)  # ``intake`` in this version's shape where missing
            migrate(db, version)
            version = TABLE_VERSION
        return db, version
    except sqlite3.DatabaseError as err:
        raise StateDirError(f"cannot read the job table {path}: {err}; run `gpuq doctor`") from None
    except UnicodeDecodeError:  # SQLite's own schema text damaged past UTF-8
        raise StateDirError(f"cannot read the job table {path}: its schema is damaged; run `gpuq doctor`") from None


def _open(path: Path, create: bool) -> tuple[sqlite3.Connection, int]:
    """A connection to the table and its version. A reader that cannot write the table's directory (a user
    of a shared queue) depends on its ``-wal`` and ``-shm``, which a root connection makes when it opens the
    table with none open and removes when it closes last (the daemon starting; root's `gpuq status` while it
    is stopped or killed). Where both are gone it reads the table as a file nobody writes (``locked_out``);
    where its open failed on files that a root connection made or removed meanwhile, it opens afresh."""
    deadline = time.monotonic() + BUSY_TIMEOUT
    while True:
        before = _wal_files(path)
        db = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT)
        try:
            version = _first_read(db)  # first: any statement that loads the schema meets what it waits for
            db.execute("PRAGMA synchronous=NORMAL")
            return db, version
        except sqlite3.OperationalError:
            db.close()
            if create:
                raise
            if locked_out(path):
                db = open_immutable(path)
                return db, db.execute("PRAGMA user_version").fetchone()[0]
            if _wal_files(path) == before or time.monotonic() > deadline:
                raise


def _wal_files(path: Path) -> tuple[int, int]:
    """The sizes of the table's -wal and -shm (-1: none)."""
    sizes = []
    for suffix in ("-wal", "-shm"):
        try:
            sizes.append(os.stat(f"{path}{suffix}").st_size)
        except OSError:
            sizes.append(-1)
    return sizes[0], sizes[1]


BUSY_TIMEOUT = 30.0  # seconds a connection waits for another's lock (SQLite's busy timeout), or its recovery
_RECOVERING = 264  # SQLITE_READONLY_RECOVERY (sqlite3.SQLITE_READONLY_RECOVERY from Python 3.11)


def _first_read(db: sqlite3.Connection) -> int:
    """The table's version, read once a connection that cannot write the ``-shm`` (a user of a shared queue)
    can read at all. A read-write connection that opens the ``-shm`` first (no other holds it: root's daemon
    starting, root's `gpuq status` after a kill -9 of the daemon) truncates it and rebuilds the WAL index at
    its first read. A reader that maps it in between finds the index's header blank, and SQLite gives a
    read-only connection no lock to wait on there: it fails at once with SQLITE_READONLY_RECOVERY ("attempt
    to write a readonly database"), which is what a user's submit or status once met during the kill -9
    bursts. That state ends when the other connection's read has rebuilt the index, so the reader waits for
    it as its busy timeout waits for a lock (Python 3.10 does not say the error's code: there it fails)."""
    deadline = time.monotonic() + BUSY_TIMEOUT
    while True:
        try:
            version: int = db.execute("PRAGMA user_version").fetchone()[0]
            return version
        except sqlite3.OperationalError as err:
            if getattr(err, "sqlite_errorcode", None) != _RECOVERING or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def locked_out(path: Path) -> bool:
    """A WAL table whose ``-shm`` file is gone (its last connection closed it) in a directory we cannot write
    (a user of a shared queue whose daemon stopped or was killed): SQLite cannot open it for reading."""
    return not os.path.exists(f"{path}-shm") and not os.access(path.parent, os.W_OK)


def open_immutable(path: Path) -> sqlite3.Connection:
    """``path`` opened as a file nobody writes, without the ``-shm`` index: right when ``locked_out`` (the
    last connection to close checkpointed the log into the table and removed it), and only for one read:
    readers open the table anew for each (``Queue.table``), so the next read sees a daemon that started."""
    return sqlite3.connect(path.absolute().as_uri() + "?mode=ro&immutable=1", uri=True, isolation_level=None)

"""A user's reads of a shared queue's job table while root connections open and close it (issue 38's flake:
"attempt to write a readonly database" in the kill -9 bursts of tests/test_shared_lifetime.py).

A user cannot write root's state directory, so the table's -wal and -shm are root's to make (when a root
connection opens the table and no other has it open: the daemon starting, root's `gpuq status` while it is
stopped or killed), to rebuild (that first connection truncates the -shm, then rebuilds the index at its first
read) and to remove (the last to close). Here root opens, writes and closes a WAL table in a loop, each time
the first and the last, while a user reads it with ``jobs.store.schema.connect`` from the gpuq tree given,
for as long as given; printed: root's opens, the user's reads that worked and those that failed, by
SQLite's error code (264: SQLITE_READONLY_RECOVERY, 1544: SQLITE_READONLY_DIRECTORY, 14: SQLITE_CANTOPEN).

Needs root; the reads run as ``nobody``, from a tree ``nobody`` can read (a copy of ``build/installed``):

    sudo .venv/bin/python bench/table_race.py TREE [TREE...] [--seconds 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sqlite3
import subprocess
import sys
import tempfile
import time

READER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from gpuq_scheduler.jobs.store import schema
ok, failed = 0, {}
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    try:
        db, _ = schema.connect(Path(sys.argv[1]))
        db.execute("SELECT count(*) FROM t").fetchone()
        db.close()
        ok += 1
    except Exception as err:
        code = str(getattr(err.__context__, "sqlite_errorcode", type(err).__name__))
        failed[code] = failed.get(code, 0) + 1
print(json.dumps({"ok": ok, "failed": failed}))
"""


def one(tree: str, seconds: float, python: str, user: pwd.struct_passwd) -> dict[str, object]:
    base = tempfile.mkdtemp(prefix="gpuq-table-race-")
    os.chmod(base, 0o755)  # root's: nobody reads it, writes nothing there
    db = f"{base}/jobs.db"
    made = sqlite3.connect(db, isolation_level=None)
    made.execute("PRAGMA journal_mode=WAL")
    made.execute("CREATE TABLE t(x)")
    made.close()
    os.chmod(db, 0o644)
    reader = subprocess.Popen(
        [python, "-c", READER, db, tree, str(seconds)],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    opens, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        root = sqlite3.connect(db, isolation_level=None)
        root.execute("INSERT INTO t VALUES (1)")
        root.close()
        opens += 1
    found: dict[str, object] = json.loads(reader.communicate()[0])
    for name in os.listdir(base):
        os.unlink(f"{base}/{name}")
    os.rmdir(base)
    return {"tree": tree, "root_opens": opens, **found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--python", default="/usr/bin/python3")
    args = parser.parse_args()
    user = pwd.getpwnam("nobody")
    print(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), os.cpu_count(), "cores;", sqlite3.sqlite_version)
    for _ in range(args.rounds):
        for tree in args.trees:  # side by side in each round: the machine's load drifts between rounds
            print(json.dumps(one(tree, args.seconds, args.python, user)), flush=True)


if __name__ == "__main__":
    sys.exit(main())

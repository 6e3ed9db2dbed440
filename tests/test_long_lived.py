"""What a daemon that runs for months must not keep a little of for every job.

pathlib interns every name it parses, and Python 3.12 before 3.12.7 never frees an interned string (3.11
does, but its intern table churns: the memory soak saw the daemon's heap step up by ~0.9 MB every few
thousand jobs). A daemon or shim that made a Path of a job's own files would keep each job's file names
for good, so those are named by strings (jobs.store.statedir). This runs a real daemon, its shims and jobs
with ``sys.intern`` watched in each of them, and asserts that none of a job's file names was interned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuq_scheduler.jobs.store.statedir import StateDir
from tests.conftest import Gpuq

# Loaded by every gpuq process of the test (PYTHONPATH): it records the per-job names that reach sys.intern.
WATCH = r"""
import os, re, sys
_intern, _out = sys.intern, os.environ["GPUQ_TEST_INTERNED"]
with open(_out + ".loaded", "a") as loaded:
    loaded.write(f"{os.getpid()}\n")
_job_file = re.compile(r"\.?(\d+\.(exit|pid|next|log|json|notify\.log)|submit-[0-9a-f]+\.json)(\.[0-9a-f]+\.tmp)?")
def intern(text):
    if _job_file.fullmatch(text):
        with open(_out, "a") as out:
            out.write(f"{os.getpid()} {sys.argv[0]} {text}\n")
    return _intern(text)
sys.intern = intern
"""


def test_no_process_of_the_queue_interns_a_jobs_file_names(gpuq: Gpuq, tmp_path: Path) -> None:
    watch, found = tmp_path / "watch", tmp_path / "interned.txt"
    watch.mkdir()
    (watch / "sitecustomize.py").write_text(WATCH)
    gpuq.env["PYTHONPATH"] = f"{watch}{os.pathsep}{gpuq.env['PYTHONPATH']}"
    gpuq.env["GPUQ_TEST_INTERNED"] = str(found)
    gpuq.run("pause")
    # Whole-GPU jobs queued behind each other (hand-offs), a packed one, a failing one (its log is read for
    # a reason), one with a --notify command (its own log), and a cancelled one.
    ids = [gpuq.submit("true") for _ in range(8)]
    ids.append(gpuq.submit("--mem", "10G", "true"))
    ids.append(gpuq.submit("sh", "-c", "echo Traceback; exit 3"))
    ids.append(gpuq.submit("--notify", "true", "true"))
    doomed = gpuq.submit("--after", str(ids[-1]), "sleep", "60")
    gpuq.run("cancel", str(doomed))
    gpuq.run("unpause")
    gpuq.run("wait", check=False)
    states = {job["id"]: job["state"] for job in gpuq.status()}
    assert [states[i] for i in ids].count("succeeded") == len(ids) - 1, states
    assert states[doomed] == "cancelled"
    state = StateDir(gpuq.home)
    assert os.path.exists(state.log(ids[0]))  # the jobs wrote their files where the names say
    daemon = (gpuq.home / "daemon.pid").read_text().strip()
    gpuq.run("daemon", "stop")
    assert daemon in Path(f"{found}.loaded").read_text().split()  # the daemon ran with the watch
    interned = found.read_text().splitlines() if found.exists() else []
    assert interned == [], "job file names interned:\n" + "\n".join(interned[:20])


def test_the_watch_sees_what_pathlib_interns(tmp_path: Path) -> None:
    """The watch above would catch a Path made of a job's file (it is not blind to pathlib)."""
    found = tmp_path / "interned.txt"
    script = f"{WATCH}\nfrom pathlib import Path\nos.fspath(Path({str(tmp_path)!r}) / '4242.exit')\n"
    subprocess.run([sys.executable, "-c", script], env={**os.environ, "GPUQ_TEST_INTERNED": str(found)}, check=True)
    lines = found.read_text().splitlines() if found.exists() else []
    if sys.version_info >= (3, 14):  # pathlib interns nothing there
        assert lines == []
    else:
        assert [line.split()[-1] for line in lines] == ["4242.exit"]

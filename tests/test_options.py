"""Each option of `gpuq submit` is declared once (jobs.options): one added there alone is the CLI's (its help,
click and the quick path), the Python API's, checked alike everywhere, and kept in the job's stored record.

The option is added as a developer would add it, to the declaration, in every gpuq process of the test
(a ``sitecustomize`` on their PYTHONPATH): the CLI, the API's caller, and the daemon that records the job.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.store import outbox
from gpuq_scheduler.jobs.store.statedir import StateDir
from tests.conftest import Gpuq, wait_for
from tests.unit.test_cli_submit import DRIVER, QUICK, Run

DECLARED = """
from gpuq_scheduler.jobs import options
from gpuq_scheduler.jobs.errors import BadInput


def _colour(value):
    if value is not None and value not in ("red", "blue"):
        raise BadInput(f"--colour {value!r}: choose red or blue")
    return value


COLOUR = options.Option("--colour", "str", None, "The job's colour (red or blue).", metavar="NAME", field="colour",
                        capture=_colour)
options.SUBMIT = (*options.SUBMIT, COLOUR)
"""

READ_BACK = """
import sys
from sitecustomize import COLOUR
from gpuq_scheduler.jobs.api import details
print(details(int(sys.argv[1])).spec.value(COLOUR))
"""


def _python(gpuq: Gpuq, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=gpuq.env, cwd=gpuq.cwd, capture_output=True, text=True, timeout=120
    )


def _stored(gpuq: Gpuq, job_id: int) -> dict[str, object]:
    db = sqlite3.connect(gpuq.home / "jobs.db")
    try:
        (spec,) = db.execute("SELECT spec FROM jobs WHERE id = ?", (job_id,)).fetchone()
    finally:
        db.close()
    return dict(json.loads(spec))


def test_an_option_added_to_the_declaration_alone_reaches_the_cli_the_api_and_the_stored_record(
    gpuq: Gpuq, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(DECLARED)
    plain_env = dict(gpuq.env)
    gpuq.env["PYTHONPATH"] = f"{site}{os.pathsep}{gpuq.env['PYTHONPATH']}"

    assert "--colour NAME" in gpuq.run("submit", "--help").stdout  # click's help, from the declaration

    api = _python(gpuq, "-c", "from gpuq_scheduler import submit; print(submit(['true'], colour='red'))")
    assert api.returncode == 0, api.stderr
    by_api = int(api.stdout)
    gpuq.wait_state(by_api, "succeeded")  # its daemon ran, and wrote the GPU inventory the quick path reads

    quick = Run(_python(gpuq, "-c", DRIVER, QUICK, "submit", "--json", "true", "--colour", "blue"))
    assert quick.returncode == 0, quick.stderr
    assert "click" not in quick.modules  # the quick path took it
    by_quick = int(json.loads(quick.stdout)["id"])
    by_click = gpuq.submit("--after", str(by_api), "--colour", "red", "true")  # --after: click's path
    plain = gpuq.submit("true")

    for job_id, colour in ((by_api, "red"), (by_quick, "blue"), (by_click, "red"), (plain, None)):
        gpuq.wait_state(job_id, "succeeded")
        assert _stored(gpuq, job_id)["colour"] == colour
        read = _python(gpuq, "-c", READ_BACK, str(job_id))
        assert read.returncode == 0 and read.stdout == f"{colour}\n", read.stderr

    # Checked by its declaration's capture, in the same one line from the quick path, click's and the API.
    before = len(gpuq.status())
    refusals = [
        Run(_python(gpuq, "-c", DRIVER, QUICK, "submit", "--colour", "green", "true")),
        Run(_python(gpuq, "-c", DRIVER, "gpuq_scheduler.launcher.cli.app", "submit", "--colour", "green", "true")),
    ]
    for run in refusals:
        assert (run.returncode, run.stdout, run.stderr) == (2, "", "gpuq: --colour 'green': choose red or blue\n")
    assert "click" not in refusals[0].modules
    api = _python(gpuq, "-c", "from gpuq_scheduler import submit; submit(['true'], colour='green')")
    assert api.returncode == 1 and "BadInput: --colour 'green': choose red or blue" in api.stderr
    assert len(gpuq.status()) == before
    # ...and by the daemon's intake, in a request written by hand: set aside, saying why.
    spec = {**JobSpec(("true",), str(gpuq.cwd)).to_json(), "colour": "green"}
    outbox.write_submit(StateDir(gpuq.home), 900, spec, time.time())
    said = wait_for(lambda: (s := gpuq.run("status").stderr) and "set aside" in s and s, 30, "the request set aside")
    assert "--colour 'green': choose red or blue" in said, said
    assert len(gpuq.status()) == before

    # Without the declaration, nothing knows the option.
    gpuq.env = plain_env
    unknown = gpuq.run("submit", "--colour", "red", "true", check=False)
    assert unknown.returncode == 2 and "No such option '--colour'" in unknown.stderr
    api = _python(gpuq, "-c", "from gpuq_scheduler import submit; submit(['true'], colour='red')")
    assert "TypeError: submit() got an unexpected keyword argument 'colour'" in api.stderr

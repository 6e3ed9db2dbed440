"""`gpuq suspend` and `gpuq resume` without click: a plain one (job ids and nothing else) runs here
(``launcher.cli.entry`` sends it here), and click's commands (``launcher.cli.suspend_resume``) call the same
``act``, so both ask the same of the daemon, print the same and refuse in the same words.

A suspend is waited for between two phases of someone's work, and its whole time counts against the
driver's own checkpoint (issue #28: within 5 % of it): click and the job model together cost several times
Python's own start. The jobs are read and checked by ``jobs.store.suspend_requests`` (sqlite3 alone, in the
plain case), and the daemon is woken through its FIFO (``outbox.ensure_daemon``), so it takes the request
at once rather than at its next poll.

Whatever is unusual goes to click, which prints the canonical help or usage error: help, an option, no id
at all, a word that is not a number written with 0-9 (click's NUMBER says so), shell completion, and a
global option before the command.
"""

from __future__ import annotations

import sys

from gpuq_scheduler.jobs.errors import BadInput, UnknownJob
from gpuq_scheduler.jobs.store import suspend_requests
from gpuq_scheduler.jobs.store.statedir import INVENTORY, StateDir

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpuq_scheduler.jobs.model import JobRecord
    from gpuq_scheduler.jobs.store.actions import Action
    from gpuq_scheduler.jobs.store.suspend_requests import Named


def parse(args: Sequence[str]) -> list[int] | None:
    """The job ids of `gpuq suspend/resume ARGS` when ARGS are ids written with 0-9 and nothing else (as
    click's NUMBER reads them), else None: the rest is click's."""
    if not args or not all(arg.isascii() and arg.isdigit() for arg in args):
        return None
    return [int(arg) for arg in args]


def quick(action: Action, args: Sequence[str]) -> bool:
    """Run `gpuq suspend/resume ARGS` here if ``parse`` takes ARGS; False, having done nothing, if not."""
    job_ids = parse(args)
    if job_ids is None:
        return False
    act(StateDir.from_env(), action, job_ids)
    return True


def act(state: StateDir, action: Action, job_ids: Sequence[int]) -> None:
    """Ask the daemon to suspend (``action``) or resume the jobs, wake it, and say so, one line a job."""
    from gpuq_scheduler.jobs.store.outbox import ensure_daemon

    try:
        refuse = (lambda chosen: refuse_mps_clients(state, chosen)) if action == "suspend" else None
        chosen = suspend_requests.ask(state, action, job_ids, resolve=lambda ids: _resolve(state, ids), refuse=refuse)
    except UnknownJob:  # ids that name jobs are jobs, whatever their state: only unknown ones may be GPUs
        if action == "resume":
            old_spelling(state, job_ids)
        raise
    ensure_daemon(state)
    verb = "suspending" if action == "suspend" else "resuming"
    sys.stdout.write("".join(f"{verb} job {job.id}\n" for job in chosen))
    sys.stdout.flush()


def _resolve(state: StateDir, job_ids: list[int]) -> list[JobRecord]:
    """The jobs named, as `gpuq status` finds them (the spool, jobs sent to clusters): what the table alone
    does not answer (``jobs.store.suspend_requests.in_table``)."""
    from gpuq_scheduler.jobs.api import readers

    return readers(state).resolve(job_ids)


def refuse_mps_clients(state: StateDir, chosen: Sequence[Named]) -> None:
    """A packed one-GPU job on a queue whose fence is MPS runs as a client of an MPS server, whose lock the
    driver refuses (801): only a --preemptible job, whose PyTorch memory gpuq's fast path moves, is suspended
    there, in place (docs/suspend.md). Any other is refused here, in one line, before anything is asked (the
    daemon checks it too)."""
    packed = [job for job in chosen if job.mem_per_gpu is not None and job.want_gpus == 1]
    if not packed:
        return  # no job could be one: gpus.json needs no reading
    import json

    try:
        with open(state.at(INVENTORY), "rb") as handle:
            fences = {gpu["index"]: gpu.get("fence") for gpu in json.load(handle)["gpus"]}
    except (OSError, ValueError, KeyError, TypeError):
        return
    clients = [job.id for job in packed if all(fences.get(gpu) == "mps" for gpu in job.gpus)]
    # Their specs, the full read: only for such jobs, so a plain suspend stays on the quick path.
    for record in _resolve(state, clients) if clients else []:
        if not record.spec.preemptible:
            raise BadInput(
                f"job {record.id} runs as a client of an MPS server (packed with --mem under the MPS fence), which "
                "the driver cannot checkpoint; only a --preemptible PyTorch job is suspended in place there: "
                "submit it with --preemptible"
            )


def old_spelling(state: StateDir, job_ids: Sequence[int]) -> None:
    """`gpuq resume GPU...` undrained GPUs before `resume` was a job's word: ids that name no job but are all
    GPUs here are taken for that, and the error says what to type. An id that names a job, ended or not, is
    that job's (issue #39: an ended job 1 was answered with `gpuq undrain 1`)."""
    from gpuq_scheduler.jobs.submission import Inventory

    inventory = Inventory.read(state.at(INVENTORY))
    if inventory is not None and all(0 <= i < len(inventory.totals) for i in job_ids):
        listed = " ".join(map(str, job_ids))
        raise BadInput(
            f"`gpuq resume` takes suspended jobs' ids; to place jobs on GPU(s) {listed} again, "
            f"type `gpuq undrain {listed}`"
        )

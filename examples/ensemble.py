"""The overnight ensemble: N seeds of train_digits.py queued through gpuq, then a majority vote.

    python examples/ensemble.py --members 8            # one GPU each (CPU jobs where there is no GPU)
    python examples/ensemble.py --members 16 --mem 4G  # several members share each GPU

Uses gpuq's Python API (``from gpuq_scheduler import submit, wait``) on the queue gpuq would use from this
shell (``$GPUQ_HOME``, else the one a config file names, such as a shared queue set up on this machine, else
~/.local/state/gpuq), and says which. A daemon is started if none runs. Prints a line as each member ends,
then where each member ran, its test accuracy, and the accuracy of the members' majority vote.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout: `jobs` and `launcher` sit beside examples/

from gpuq_scheduler import JobRecord, JobState, submit, wait  # noqa: E402
from gpuq_scheduler.jobs import config  # noqa: E402
from gpuq_scheduler.jobs.store.statedir import StateDir  # noqa: E402
from gpuq_scheduler.launcher.gpus.sources import usable_gpus  # noqa: E402


def which_queue() -> str:
    """The queue this run uses, as a person needs to know it: whose it is, where it is, and why that one."""
    state = StateDir.from_env()
    if os.environ.get("GPUQ_HOME"):
        why = "from $GPUQ_HOME"
    else:
        settings = config.load()
        why = f"named in {', '.join(map(str, settings.sources))}" if settings.home is not None else "the default"
    try:  # a shared queue is root's, with a sticky spool everyone may drop requests in (`gpuq daemon setup`)
        shared = state.is_foreign() or bool(os.stat(state.spool).st_mode & stat.S_ISVTX)
    except OSError:  # not made yet: the first submit makes a personal one
        shared = False
    kind = "the shared queue set up on this machine" if shared else "your personal queue"
    return f"{kind}, {state.root} ({why})"


class Progress:
    """One line as each member ends, printed as it happens (flushed: a log file or a pipe sees it too)."""

    def __init__(self, seeds: dict[int, int]) -> None:
        self.seeds = seeds
        self.reported: set[int] = set()

    def __call__(self, records: list[JobRecord]) -> None:
        for record in sorted(records, key=lambda r: (r.ended_at or 0, r.id)):
            if record.state.finished and record.id not in self.reported:
                self.reported.add(record.id)
                runtime = (record.ended_at or 0) - (record.started_at or record.ended_at or 0)
                how = record.state.value + (f": {record.reason}" if record.reason else "")
                print(
                    f"[{len(self.reported)}/{len(self.seeds)}] seed {self.seeds[record.id]} (job {record.id}) "
                    f"{how} after {runtime:.1f}s",
                    flush=True,
                )


def majority_vote(member_predictions: list[list[int]]) -> list[int]:
    """Per test image, the class most members predicted (ties go to the smallest class)."""
    per_image = zip(*member_predictions, strict=True)
    return [min(Counter(votes).most_common(), key=lambda kv: (-kv[1], kv[0]))[0] for votes in per_image]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=8, help="ensemble members, one seed each (default 8)")
    parser.add_argument("--epochs", type=int, default=15, help="epochs per member (default 15)")
    parser.add_argument("--mem", help="GPU memory per member, e.g. 4G (default: a whole GPU each)")
    parser.add_argument("--out", type=Path, default=Path("ensemble-out"), help="where predictions go")
    parser.add_argument("--cpu", action="store_true", help="run members as CPU jobs even where there are GPUs")
    args = parser.parse_args(argv)

    gpus = 0 if args.cpu else min(1, usable_gpus())
    where = (
        "on the CPU (no GPU found)"
        if gpus == 0 and not args.cpu
        else "on the CPU"
        if gpus == 0
        else (f"one GPU each{' with ' + args.mem if args.mem else ''}")
    )
    print(f"queue: {which_queue()}", flush=True)
    print(f"queuing {args.members} members {where}", flush=True)
    # Members that train on the CPU (no GPU, or only fake ones) run side by side: one thread each keeps
    # them from fighting over the cores.
    cpu_bound = gpus == 0 or bool(os.environ.get("GPUQ_FAKE_GPUS"))
    env = {"OMP_NUM_THREADS": "1"} if cpu_bound else {}
    args.out.mkdir(parents=True, exist_ok=True)
    outputs = {}
    for seed in range(args.members):
        prediction = (args.out / f"member-{seed}.json").resolve()
        prediction.unlink(missing_ok=True)
        job_id = submit(
            [
                str(HERE / "train_digits.py"),
                "--seed",
                str(seed),
                "--epochs",
                str(args.epochs),
                "--predictions",
                str(prediction),
            ],
            gpus=gpus,
            mem=args.mem if gpus else None,
            name=f"digits-seed{seed}",
            env=env,
        )
        outputs[job_id] = (seed, prediction)

    print(f"jobs {min(outputs)}-{max(outputs)} queued; `gpuq status` shows them; waiting for them to end", flush=True)
    records = wait(list(outputs), on_progress=Progress({job_id: seed for job_id, (seed, _) in outputs.items()}))
    members = []
    for record in sorted(records, key=lambda r: outputs[r.id][0]):
        seed, prediction = outputs[record.id]
        placed = ",".join(map(str, record.gpus)) or "cpu"
        if record.state is not JobState.SUCCEEDED:
            print(f"member seed {seed:>3}  job {record.id:>5}  gpu {placed:<5}  {record.state.value}: {record.reason}")
            continue
        result = json.loads(prediction.read_text())
        members.append(result)
        runtime = (record.ended_at or 0) - (record.started_at or 0)
        print(
            f"member seed {seed:>3}  job {record.id:>5}  gpu {placed:<5}  "
            f"accuracy {result['accuracy']:.4f}  {runtime:5.1f}s"
        )
    if not members:
        print("no member succeeded; `gpuq logs ID` shows why", file=sys.stderr)
        return 1
    labels = members[0]["labels"]
    votes = majority_vote([m["predictions"] for m in members])
    ensemble = sum(v == y for v, y in zip(votes, labels, strict=True)) / len(labels)
    best = max(m["accuracy"] for m in members)
    mean = sum(m["accuracy"] for m in members) / len(members)
    print(f"members: {len(members)}/{args.members} succeeded, mean accuracy {mean:.4f}, best {best:.4f}")
    print(f"ensemble (majority vote) accuracy: {ensemble:.4f}")
    return 0 if len(members) == args.members else 1


if __name__ == "__main__":
    sys.exit(main())

"""A learning-rate sweep written as a Python function, not a script: gpuq's ``Executor`` runs each call as
a job on a GPU of its own (or packed, with --mem), and brings the return values back.

    python examples/sweep_functions.py                          # 6 learning rates, one GPU each
    python examples/sweep_functions.py --mem auto --throttle 4   # packed by learned memory, 4 at a time
    python examples/sweep_functions.py --on lab                  # the same calls on a Slurm cluster

``map_array`` queues the whole grid as one gpuq array. Where there is no GPU the jobs run on the CPU
(``--gpus 0`` is chosen for you when gpuq finds none). Prints each run's accuracy and the best one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout: gpuq_scheduler sits beside examples/

from gpuq_scheduler import Executor, as_completed  # noqa: E402
from gpuq_scheduler.launcher.gpus.sources import usable_gpus  # noqa: E402

LEARNING_RATES = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def train(lr: float, epochs: int, seed: int) -> dict[str, float | int | str]:
    """Train the digits CNN at one learning rate; runs inside a gpuq job, on the GPU gpuq gave it."""
    started = time.perf_counter()
    sys.path.insert(0, str(HERE))  # the job may run from another directory: digits_model sits beside this file
    import torch
    from digits_model import DigitsCNN, evaluate, gpuq_allocation, load_data, loader, seed_everything, train_one_epoch

    seed_everything(seed)
    allocation = gpuq_allocation()
    device = allocation.device() if allocation is not None else torch.device("cpu")
    train_set, test_set = load_data()
    generator = torch.Generator().manual_seed(seed)
    batches = loader(train_set, 64, device, shuffle=True, generator=generator)
    model = DigitsCNN().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        train_one_epoch(model, batches, optimizer, device)
    accuracy, _ = evaluate(model, loader(test_set, 512, device), device)
    return {"lr": lr, "accuracy": accuracy, "device": str(device), "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mem", help="memory per job (20G, auto); default: a whole GPU each")
    parser.add_argument("--throttle", type=int, help="at most this many at once")
    parser.add_argument("--on", help="a Slurm cluster from your gpuq config, instead of this machine")
    args = parser.parse_args(argv)

    gpus = 1 if args.on or usable_gpus() else 0
    executor = Executor(gpus=gpus, mem=args.mem if gpus else None, name="lr-sweep", on=args.on)
    jobs = executor.map_array(
        train,
        LEARNING_RATES,
        [args.epochs] * len(LEARNING_RATES),
        [args.seed] * len(LEARNING_RATES),
        throttle=args.throttle,
    )
    print(f"queued {len(jobs)} runs as jobs {jobs[0].id}-{jobs[-1].id} ({'GPU' if gpus else 'CPU'} jobs)", flush=True)
    results = []
    for job in as_completed(jobs):
        result = job.result()
        results.append(result)
        print(
            f"job {job.id}: lr {result['lr']:g} accuracy {result['accuracy']:.4f} "
            f"on {result['device']} in {result['seconds']}s",
            flush=True,
        )
    best = max(results, key=lambda r: float(r["accuracy"]))
    print(f"best learning rate: {best['lr']:g} (test accuracy {best['accuracy']:.4f})")


if __name__ == "__main__":
    main()

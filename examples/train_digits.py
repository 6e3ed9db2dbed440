"""Train a small CNN on scikit-learn's digits on one GPU, or on the CPU when there is none.

Written the way PyTorch's CUDA notes recommend: one device chosen up front, model and batches moved
with .to(device), pinned memory and non-blocking copies. Under gpuq it trains on the GPU it was given
and caps its memory at what it asked for with --mem.

    gpuq submit --gpus 1 --mem 4G examples/train_digits.py --seed 3
    python examples/train_digits.py --seed 3
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import torch
from digits_model import (
    DigitsCNN,
    atomic_save,
    common_arguments,
    describe_devices,
    evaluate,
    gpuq_allocation,
    load_data,
    loader,
    max_memory_allocated,
    seed_everything,
    train_one_epoch,
    write_json,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = common_arguments("Train a small CNN on the digits data set.", epochs=20, batch_size=64, lr=1e-3)
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="save model, optimizer and epoch here after every epoch; if the file exists, resume from it",
    )
    parser.add_argument(
        "--predictions",
        type=Path,
        help="write the test-set predictions, labels and accuracy here as JSON (for majority voting)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    seed_everything(args.seed)

    allocation = gpuq_allocation()
    if allocation is None:
        args.device = torch.device("cuda" if not args.disable_cuda and torch.cuda.is_available() else "cpu")
    else:
        args.device = allocation.device(args.disable_cuda)
    print(describe_devices(args.device), flush=True)
    if allocation is not None and allocation.under_gpuq:
        fraction = allocation.cap_memory() if args.device.type == "cuda" else None
        cap = "none" if fraction is None else f"{fraction:.4f}"
        print(
            f"gpuq job {allocation.job_id} name {allocation.name!r} mode {allocation.mode} "
            f"gpus {list(allocation.gpus)} memory fraction {cap}",
            flush=True,
        )

    train_set, test_set = load_data()
    # The batch order has its own generator, saved in the checkpoint, so a resumed run sees the same
    # batches as one that was never interrupted.
    shuffle_rng = torch.Generator().manual_seed(args.seed)
    train_batches = loader(train_set, args.batch_size, args.device, shuffle=True, generator=shuffle_rng)
    test_batches = loader(test_set, 512, args.device)

    model = DigitsCNN().to(args.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    done = 0
    if args.checkpoint is not None and args.checkpoint.exists():
        # Loaded on the CPU: load_state_dict copies into tensors already on args.device, and the
        # generator state must stay a CPU tensor.
        state = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        shuffle_rng.set_state(state["shuffle_rng"])
        done = state["epoch"]
        print(f"resumed from epoch {done}", flush=True)

    for epoch in range(done + 1, args.epochs + 1):
        loss = train_one_epoch(model, train_batches, optimizer, args.device)
        print(f"epoch {epoch}/{args.epochs} loss {loss:.4f}", flush=True)
        if args.checkpoint is not None:
            state = {
                "epoch": epoch,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "shuffle_rng": shuffle_rng.get_state(),
            }
            atomic_save(functools.partial(torch.save, state), args.checkpoint)

    accuracy, predictions = evaluate(model, test_batches, args.device)
    peak = max_memory_allocated(args.device)
    print(f"test accuracy: {accuracy:.4f}")
    print(f"max memory allocated: {peak} bytes")

    job_id = allocation.job_id if allocation is not None else None
    if args.predictions is not None:
        labels = test_set.tensors[1].tolist()
        write_json(
            args.predictions,
            {"accuracy": accuracy, "predictions": predictions, "labels": labels, "seed": args.seed, "job_id": job_id},
        )
    if args.out_json is not None:
        write_json(
            args.out_json,
            {
                "accuracy": accuracy,
                "epochs": args.epochs,
                "seed": args.seed,
                "device": str(args.device),
                "max_memory_allocated": peak,
                "seconds": round(time.perf_counter() - started, 3),
                "job_id": job_id,
            },
        )


if __name__ == "__main__":
    main()

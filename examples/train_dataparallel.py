"""Train the digits CNN in one process over every GPU it can see, with nn.DataParallel.

Each batch is split across the visible GPUs and the gradients are summed on cuda:0. gpuq's
"dataparallel" mode gives one process several GPUs; the per-GPU memory printed at the end shows that
each of them did work. Without CUDA it trains on the CPU, unwrapped.

    gpuq submit --gpus 2 --mode dataparallel examples/train_dataparallel.py
    python examples/train_dataparallel.py
"""

from __future__ import annotations

import time

import torch
from digits_model import (
    DigitsCNN,
    common_arguments,
    describe_devices,
    evaluate,
    gpuq_allocation,
    load_data,
    loader,
    seed_everything,
    train_one_epoch,
    write_json,
)
from torch import nn


def main(argv: list[str] | None = None) -> None:
    # A large batch, so that each GPU still gets a useful share of it.
    parser = common_arguments("Train the digits CNN with nn.DataParallel.", epochs=30, batch_size=256, lr=3e-3)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    seed_everything(args.seed)

    allocation = gpuq_allocation()
    model: nn.Module = DigitsCNN()
    if allocation is not None:
        device = allocation.device(args.disable_cuda)
        model = allocation.wrap(model, args.disable_cuda)
        if device.type == "cuda":
            allocation.cap_memory()
    else:
        device = torch.device("cuda" if not args.disable_cuda and torch.cuda.is_available() else "cpu")
        model = model.to(device)
        if device.type == "cuda" and torch.cuda.device_count() > 1:
            model = nn.DataParallel(model)
    print(describe_devices(device), flush=True)
    print(f"model: {type(model).__name__}", flush=True)

    train_set, test_set = load_data()
    shuffle_rng = torch.Generator().manual_seed(args.seed)
    train_batches = loader(train_set, args.batch_size, device, shuffle=True, generator=shuffle_rng)
    test_batches = loader(test_set, 512, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        loss = train_one_epoch(model, train_batches, optimizer, device)
        print(f"epoch {epoch}/{args.epochs} loss {loss:.4f}", flush=True)

    accuracy, _ = evaluate(model, test_batches, device)
    print(f"test accuracy: {accuracy:.4f}")
    # cuda:0 holds the master weights and gathers outputs, so it peaks higher than the others.
    gpus = range(torch.cuda.device_count()) if device.type == "cuda" else range(0)
    peaks = [torch.cuda.max_memory_allocated(i) for i in gpus]
    for index, peak in enumerate(peaks):
        print(f"gpu {index}: {peak} bytes")

    if args.out_json is not None:
        write_json(
            args.out_json,
            {
                "accuracy": accuracy,
                "epochs": args.epochs,
                "seed": args.seed,
                "device": str(device),
                "model": type(model).__name__,
                "max_memory_allocated_per_gpu": peaks,
                "seconds": round(time.perf_counter() - started, 3),
            },
        )


if __name__ == "__main__":
    main()

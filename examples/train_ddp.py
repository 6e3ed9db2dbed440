"""Train the digits CNN with DistributedDataParallel: one process per GPU, started by torchrun.

Each rank trains on its own shard of the data (DistributedSampler) and DDP averages the gradients, over
NCCL between GPUs or gloo on the CPU. gpuq's "torchrun" mode starts it with a free port:

    gpuq submit --gpus 2 --mode torchrun examples/train_ddp.py
    python -m torch.distributed.run --nnodes 1 --nproc-per-node 2 examples/train_ddp.py
"""

from __future__ import annotations

import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from digits_model import (
    DigitsCNN,
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
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler


def main(argv: list[str] | None = None) -> None:
    parser = common_arguments(
        "Train the digits CNN with DistributedDataParallel (start it with torchrun).",
        epochs=20,
        batch_size=64,
        lr=1e-3,
    )
    args = parser.parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        parser.error(
            "start me with torchrun, e.g. python -m torch.distributed.run --nproc-per-node 2 "
            f"{sys.argv[0]}, or through gpuq with --mode torchrun"
        )
    started = time.perf_counter()

    allocation = gpuq_allocation()
    if allocation is not None:
        device = allocation.device(args.disable_cuda)
    else:
        cuda = not args.disable_cuda and torch.cuda.is_available()
        device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if cuda else "cpu")
    if device.type == "cuda":
        # Before the process group, so that NCCL's communicator lands on this rank's GPU only.
        torch.cuda.set_device(device)
        if allocation is not None:
            allocation.cap_memory()
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} device {device} backend {dist.get_backend()}", flush=True)
    if rank == 0:
        print(describe_devices(device), flush=True)

    # The same seed on every rank; DDP also broadcasts rank 0's weights when it wraps the model.
    seed_everything(args.seed)
    train_set, test_set = load_data()
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    train_batches = loader(train_set, args.batch_size, device, sampler=sampler)
    model = DigitsCNN().to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        loss = train_one_epoch(ddp_model, train_batches, optimizer, device)
        if rank == 0:
            print(f"epoch {epoch}/{args.epochs} loss {loss:.4f} (rank 0's shard)", flush=True)

    peak = max_memory_allocated(device)
    print(f"rank {rank}/{world} max memory allocated: {peak} bytes", flush=True)
    if rank == 0:
        # Every rank holds the same weights after the last step, so rank 0 alone can test them.
        accuracy, _ = evaluate(model, loader(test_set, 512, device), device)
        print(f"test accuracy: {accuracy:.4f}", flush=True)
        if args.out_json is not None:
            write_json(
                args.out_json,
                {
                    "accuracy": accuracy,
                    "epochs": args.epochs,
                    "seed": args.seed,
                    "world_size": world,
                    "device": str(device),
                    "max_memory_allocated": peak,
                    "seconds": round(time.perf_counter() - started, 3),
                },
            )
    # Tear down together, and release DDP first: a rank that destroys its gloo group while rank 0 is
    # still evaluating can abort in gloo's teardown ("terminate called without an active exception",
    # seen in CI), and so can gloo work that DDP's reducer still holds when the interpreter finalises
    # after the group is gone (pytorch/pytorch#179291 describes that abort).
    del ddp_model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

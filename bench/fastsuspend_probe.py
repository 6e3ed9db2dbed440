"""The fast suspend's mechanism, bare, on a lent GPU host (#40): one PyTorch process with expandable segments,
its memory released to pinned host memory and restored by ``jobs/fastsuspend.py``, side by side with the
driver's checkpoint of the same process:

    python3 bench/fastsuspend_probe.py --out probe16.json --size 16   # a process per size

Per size: the process fills SIZE GiB with seeded random bytes (1 GiB tensors) and captures a CUDA graph;
then cycles, each timed and checked (NVML's used memory while away; every byte regenerated and compared
after; the graph replayed): ``fast`` (host memory pinned afresh by 8 threads; the first is the warm-up, a
lent host's memory grows as it is first touched), ``fast+driver`` (the rest, the context, then taken by the
driver's checkpoint as gpuq's helper would), ``driver`` (the driver's checkpoint of everything, from another
process as gpuq's helper calls it), ``pool`` (buffers kept pinned: the first pins, the second reuses).
Last: whether PyTorch can still give memory back (``empty_cache``) after a restore, since its own handles to
the pages it mapped were released with them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import pynvml
import torch

from gpuq_scheduler.jobs.fastmove import Mover

GIB = 1 << 30

DRIVER = """
import ctypes, json, sys, time
cuda = ctypes.CDLL("libcuda.so.1"); cuda.cuInit(0)
pid = ctypes.c_int(int(sys.argv[1])); out = {}
def call(name):
    at = time.monotonic(); code = getattr(cuda, "cuCheckpointProcess" + name)(pid, None)
    out[name] = round(time.monotonic() - at, 4)
    if code: raise SystemExit(f"{name}: CUDA error {code}")
call("Lock"); call("Checkpoint")
import pynvml; pynvml.nvmlInit()
out["used_away"] = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used
call("Restore"); call("Unlock")
print(json.dumps(out))
"""


def used() -> int:
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)


def driver_cycle() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", DRIVER, str(os.getpid())], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["suspend_s"] = out["Lock"] + out["Checkpoint"]
    out["resume_s"] = out["Restore"] + out["Unlock"]
    return out


def fill(size_gib: int) -> list[torch.Tensor]:
    chunks = []
    for index in range(size_gib):
        chunks.append(chunk(index))
    torch.cuda.synchronize()
    return chunks


def chunk(index: int) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(1000 + index)
    return torch.randint(-(2**31), 2**31 - 1, (GIB // 4,), dtype=torch.int32, generator=generator, device="cuda")


def intact(chunks: list[torch.Tensor]) -> bool:
    return all(torch.equal(tensor, chunk(index)) for index, tensor in enumerate(chunks))


def one_size(size_gib: int, rounds: dict[str, int]) -> dict[str, Any]:
    result: dict[str, Any] = {"size_gib": size_gib, "cycles": []}
    chunks = fill(size_gib)
    static = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = static * 2 + 1  # warm the kernel outside the capture
        with torch.cuda.graph(graph):
            out = static * 2 + 1
    torch.cuda.synchronize()
    result["reserved"] = torch.cuda.memory_reserved()
    result["used_before"] = used()
    fresh, pool = Mover(keep=False), Mover(keep=True)
    plan = (
        [("fast", fresh, False)] * rounds["fast"]
        + [("fast+driver", fresh, True)]
        + [("driver", None, False)] * rounds["driver"]
        + [("pool", pool, False)] * rounds["pool"]
    )
    for kind, mover, then_driver in plan:
        cycle: dict[str, Any] = {"kind": kind}
        try:
            static.fill_(3.0)
            torch.cuda.synchronize()
            if fresh.unpinning is not None:
                fresh.unpinning.join()  # its host memory given back before the next cycle takes more
            if mover is None:
                cycle.update(driver_cycle())
            else:
                at = time.monotonic()
                cycle["bytes"] = mover.release()
                cycle["release_s"] = time.monotonic() - at
                cycle["release_steps"] = dict(mover.steps)
                cycle["used_away"] = used()
                if then_driver:
                    cycle["driver_rest"] = driver_cycle()
                at = time.monotonic()
                mover.restore()
                cycle["restore_s"] = time.monotonic() - at
                cycle["restore_steps"] = dict(mover.steps)
                cycle["handles_moved"] = mover.moved
                cycle["out_GBps"] = cycle["bytes"] / cycle["release_s"] / 1e9
                cycle["in_GBps"] = cycle["bytes"] / cycle["restore_s"] / 1e9
            cycle["used_after"] = used()
            graph.replay()
            torch.cuda.synchronize()
            cycle["graph_ok"] = bool(torch.equal(out, torch.full_like(static, 7.0)))
            cycle["intact"] = intact(chunks)
        except Exception:
            cycle["error"] = traceback.format_exc()[-3000:]
        print(json.dumps(cycle), flush=True)
        result["cycles"].append(cycle)
    pool.drop()
    del chunks, graph, out, static
    return result


def after_restore_free() -> dict[str, Any]:
    """PyTorch's handles to pages released and mapped again by the fast path: can it still unmap them?"""
    mover = Mover()
    tensors = [torch.ones(GIB // 4, device="cuda") for _ in range(2)]
    torch.cuda.synchronize()
    mover.release()
    mover.restore()
    kept = tensors[0]
    del tensors
    try:
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        fine = {"empty_cache": "ok", "kept_ok": bool(kept.eq(1).all())}
    except Exception as err:
        fine = {"empty_cache": f"{type(err).__name__}: {err}"[:500]}
    return fine


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--fast", type=int, default=2)
    parser.add_argument("--driver", type=int, default=1)
    parser.add_argument("--pool", type=int, default=2)
    args = parser.parse_args()
    pynvml.nvmlInit()
    torch.cuda.init()
    found: dict[str, Any] = {"torch": torch.__version__, "driver": pynvml.nvmlSystemGetDriverVersion(), "sizes": []}
    rounds = {"fast": args.fast, "driver": args.driver, "pool": args.pool}
    found["sizes"].append(one_size(args.size, rounds))
    with open(args.out, "w") as handle:
        json.dump(found, handle, indent=1)
    try:
        found["after_restore_free"] = after_restore_free()
    except Exception:
        found["after_restore_free"] = {"error": traceback.format_exc()[-2000:]}
    with open(args.out, "w") as handle:
        json.dump(found, handle, indent=1)
    print(json.dumps(found.get("after_restore_free")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

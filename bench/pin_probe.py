"""Where the fast suspend's first copy goes (#40): pinning host memory afresh, on a lent GPU host.

    python3 bench/pin_probe.py --out pin.json [--grow 100] [--size 24]

1. The host's memory as the VM gives it: GROW GiB faulted in by 16 threads (256 MiB mmaps, MAP_POPULATE) and
   given back, then SIZE GiB again at once, then again after 15 s: whether memory given back is grown afresh.
2. ``jobs.fastmove.Mover`` on one PyTorch process holding SIZE GiB (expandable segments), each way of pinning
   (``Mover.pin``: populate, lazy, thp, hostalloc; 12 threads), host memory pinned afresh each time: release
   and restore times, the copy's GB/s, the bytes compared after.
Prints a JSON line per step; writes them all to OUT.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GIB, CHUNK = 1 << 30, 256 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.mmap.restype = ctypes.c_void_p
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def grow(gib: float, threads: int = 16) -> dict[str, Any]:
    """Fault in ``gib`` GiB (256 MiB mmaps with MAP_POPULATE, ``threads`` at once), then give it back."""
    count = int(gib * GIB) // CHUNK
    at = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        maps = list(pool.map(lambda _: libc.mmap(None, CHUNK, 3, 0x02 | 0x20 | 0x8000, -1, 0), range(count)))
    took = time.monotonic() - at
    for address in maps:
        libc.munmap(address, CHUNK)
    return {"gib": gib, "threads": threads, "s": round(took, 3), "GBps": round(count * CHUNK / took / 1e9, 2)}


def settings() -> dict[str, str]:
    found = {}
    for path in (
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/kernel/mm/transparent_hugepage/defrag",
        "/proc/sys/vm/overcommit_memory",
    ):
        try:
            found[path] = Path(path).read_text().strip()
        except OSError as err:
            found[path] = str(err)
    found["uname"] = " ".join(os.uname())
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    found["meminfo"] = "; ".join(
        line for line in meminfo if line.split(":")[0] in ("MemTotal", "MemAvailable", "MemFree")
    )
    return found


def movers(size: int, pins: list[str], threads: int) -> list[dict[str, Any]]:
    import torch

    from gpuq_scheduler.jobs.fastmove import Mover

    tensors = []
    for index in range(size):
        generator = torch.Generator(device="cuda").manual_seed(index)
        tensors.append(torch.randint(0, 2**31 - 1, (GIB // 4,), dtype=torch.int32, generator=generator, device="cuda"))
    sums = [int(t.sum(dtype=torch.int64)) for t in tensors]
    torch.cuda.synchronize()
    out = []
    for pin in pins:
        mover = Mover(pin=pin, threads=threads)
        at = time.monotonic()
        moved = mover.release()
        out_s = time.monotonic() - at
        steps = dict(mover.steps)
        at = time.monotonic()
        mover.restore()
        in_s = time.monotonic() - at
        steps.update(mover.steps)
        if mover.unpinning is not None:
            mover.unpinning.join()
        intact = [int(t.sum(dtype=torch.int64)) for t in tensors] == sums
        out.append(
            {
                "pin": pin,
                "threads": threads,
                "bytes": moved,
                "release_s": round(out_s, 3),
                "restore_s": round(in_s, 3),
                "out_GBps": round(moved / out_s / 1e9, 2),
                "in_GBps": round(moved / in_s / 1e9, 2),
                "steps": {k: round(v, 3) for k, v in steps.items()},
                "intact": intact,
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--grow", type=float, default=100.0)
    parser.add_argument("--size", type=int, default=24)
    parser.add_argument("--pins", default="populate,lazy,thp,hostalloc,populate")
    parser.add_argument("--threads", default="12", help="pinning threads: a figure, or several (12,16)")
    parser.add_argument("--skip-grow", action="store_true", help="only the movers")
    args = parser.parse_args()
    found: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "settings": settings()}
    print(json.dumps(found), flush=True)
    if args.skip_grow:
        found["movers"] = [m for t in args.threads.split(",") for m in movers(args.size, args.pins.split(","), int(t))]
        args.out.write_text(json.dumps(found, indent=1) + "\n")
        return
    found["grow_first"] = grow(args.grow)
    print(json.dumps(found["grow_first"]), flush=True)
    found["grow_again_at_once"] = grow(args.size)
    print(json.dumps(found["grow_again_at_once"]), flush=True)
    time.sleep(15)
    found["grow_again_after_15s"] = grow(args.size)
    print(json.dumps(found["grow_again_after_15s"]), flush=True)
    found["grow_again_1_thread"] = grow(args.size / 4, threads=1)
    print(json.dumps(found["grow_again_1_thread"]), flush=True)
    found["settings_after"] = settings()
    found["movers"] = [m for t in args.threads.split(",") for m in movers(args.size, args.pins.split(","), int(t))]
    args.out.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()

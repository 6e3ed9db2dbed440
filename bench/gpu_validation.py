"""gpuq on real NVIDIA GPUs, in one run: the GPU contract, a crowded mixed queue, and memory packing.

    python bench/gpu_validation.py --out DIR

1. The contract test that runs against the fake GPUs, against real NVML (plus the job-side helper's GPU tests).
2. 16 ensemble members (--mem), 2 DataParallel jobs and 1 torchrun job (--gpus 2 each) queued at once
   while a process outside gpuq holds 100 GiB on GPU 0. NVML is sampled throughout. Checks: no GPU
   over-committed, GPU 0 got only jobs that fit beside the foreign process, every job saw exactly its
   GPUs, both GPUs of each DataParallel job did work, and no job outgrew its --mem.
3. Packing: the same 16 small jobs as whole-GPU jobs and as --mem jobs; makespan of each and the speedup.
Prints a summary and writes DIR/gpu_validation.json. --fence, --auto, --non-root and --users run one
section of bench/gpu_fence.py or bench/gpu_users.py instead (--users: two users' packed jobs on one GPU,
each behind a control daemon of their own and refused past its share).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pynvml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gpuq_scheduler.launcher.policy.placement import Policy  # noqa: E402

GiB = 1 << 30
POLICY = Policy()


class Sampler(threading.Thread):
    """NVML every 100 ms: per GPU, memory used and which pids hold how much."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[dict[str, Any]] = []
        self.stopped = threading.Event()
        self.owners: dict[int, int | None] = {}  # pid -> gpuq job, read while the process still lives

    def run(self) -> None:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        while not self.stopped.is_set():
            sample: dict[str, Any] = {"t": time.time(), "gpus": []}
            for handle in handles:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                procs = {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
                for pid in procs:
                    job_of(pid, self.owners)
                sample["gpus"].append({"used": memory.used, "total": memory.total, "procs": procs})
            self.samples.append(sample)
            time.sleep(0.1)


def job_of(pid: int, cache: dict[int, int | None]) -> int | None:
    """The gpuq job a process belongs to, from its environment (we run as root on the lent machine)."""
    if pid not in cache:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ids = [e.split(b"=", 1)[1] for e in env if e.startswith(b"GPUQ_JOB_ID=")]
            cache[pid] = int(ids[0]) if ids else None
        except (OSError, ValueError, IndexError):
            cache[pid] = None
    return cache[pid]


class Gpuq:
    """The gpuq command against one state directory; as another Unix user (``user``) when given."""

    def __init__(self, home: Path, user: str | None = None, **extra: str) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        self.env.update(GPUQ_HOME=str(home), GPUQ_KILL_GRACE="5", **extra)
        self.env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + self.env.get("PATH", "")
        self.gpuq = shutil.which("gpuq", path=self.env["PATH"]) or "gpuq"
        self.as_user: dict[str, Any] = {}
        self.cwd = ROOT
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            self.as_user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            self.env.update(HOME=entry.pw_dir, USER=user, LOGNAME=user)
            self.cwd = Path(entry.pw_dir)

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            [self.gpuq, *args], env=self.env, cwd=self.cwd, capture_output=True, text=True, **self.as_user
        )
        if done.returncode != 0:
            raise RuntimeError(f"gpuq {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def submit(self, *args: str) -> int:
        return int(json.loads(self("submit", "--json", *args))["id"])

    def records(self) -> list[dict[str, Any]]:
        return list(json.loads(self("status", "--all", "--json")))


def contract() -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_gpus_contract.py",
            "tests/test_allocation_torch.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    print(f"contract: {summary}", flush=True)
    return {"passed": done.returncode == 0, "summary": summary, "output": done.stdout[-3000:]}


def hold_memory(gpu: int, gib: int) -> subprocess.Popen[str]:
    """A process outside gpuq (a teammate's notebook) holding memory on one GPU."""
    code = (
        "import sys, time, torch\n"
        f"x = torch.empty({gib} * 2**30, dtype=torch.uint8, device='cuda')\n"
        "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)\n"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def crowded_queue(work: Path) -> dict[str, Any]:
    gpuq = Gpuq(work / "crowded")
    foreign = hold_memory(0, 100)
    sampler = Sampler()
    sampler.start()
    time.sleep(0.5)
    try:
        gpuq("daemon", "start")
        kinds: dict[int, str] = {}
        mems: dict[int, int] = {}
        for seed in range(16):
            job = gpuq.submit("--mem", "4G", "--name", f"member{seed}", "examples/train_digits.py", "--seed", str(seed))
            kinds[job], mems[job] = "member", 4 * GiB
        for _ in range(2):
            job = gpuq.submit("--gpus", "2", "--mem", "8G", "--mode", "dataparallel", "examples/train_dataparallel.py")
            kinds[job], mems[job] = "dataparallel", 8 * GiB
        job = gpuq.submit("--gpus", "2", "--mem", "8G", "--mode", "torchrun", "examples/train_ddp.py")
        kinds[job], mems[job] = "torchrun", 8 * GiB
        gpuq("wait")
    finally:
        sampler.stopped.set()
        sampler.join()
        foreign.kill()
        foreign.wait()
        subprocess.run([gpuq.gpuq, "daemon", "stop"], env=gpuq.env, capture_output=True)
    records = {r["id"]: r for r in gpuq.records()}
    return check_crowded(records, kinds, mems, sampler.samples, sampler.owners, foreign.pid)


def check_crowded(
    records: dict[int, dict[str, Any]],
    kinds: dict[int, str],
    mems: dict[int, int],
    samples: list[dict[str, Any]],
    owner_cache: dict[int, int | None],
    foreign_pid: int,
) -> dict[str, Any]:
    failures: list[str] = []
    totals = [g["total"] for g in samples[0]["gpus"]]
    foreign_use = max(s["gpus"][0]["procs"].get(foreign_pid, 0) for s in samples)
    for job, record in records.items():
        if record["state"] != "succeeded":
            failures.append(f"job {job} {record['state']}: {record['reason']}")
    # 1. Reservations: at each start on each GPU, what gpuq promised plus what outsiders held fits.
    for gpu, total in enumerate(totals):
        on_gpu = [r for r in records.values() if gpu in r["gpus"]]
        outside = foreign_use if gpu == 0 else 0
        for record in on_gpu:
            instant = record["started_at"]
            present = [r for r in on_gpu if r["started_at"] <= instant < r["ended_at"]]
            promised = sum(mems[r["id"]] + POLICY.overhead for r in present)
            if promised + outside > total - POLICY.margin:
                failures.append(f"GPU {gpu} over-committed at job {record['id']}'s start: {promised + outside} bytes")
    # 2. NVML: no sample above the card, and no job above its --mem plus its context.
    worst_job_use: dict[int, int] = {}
    dp_gpus: dict[int, set[int]] = {}
    for sample in samples:
        for gpu, state in enumerate(sample["gpus"]):
            if state["used"] > state["total"]:
                failures.append(f"GPU {gpu} used {state['used']} > total at {sample['t']}")
            per_job: dict[int, int] = {}
            for pid, used in state["procs"].items():
                job = job_of(pid, owner_cache)
                if job is not None:
                    per_job[job] = per_job.get(job, 0) + used
                    if kinds.get(job) == "dataparallel":
                        dp_gpus.setdefault(job, set()).add(gpu)
            for job, used in per_job.items():
                worst_job_use[job] = max(worst_job_use.get(job, 0), used)
    for job, used in worst_job_use.items():
        if used > mems[job] + POLICY.overhead:
            failures.append(f"job {job} used {used} bytes on one GPU, more than its --mem {mems[job]} + overhead")
    # 3. Every job saw exactly its GPUs, as its own log says.
    for job, record in records.items():
        log = Path(record["log"]).read_text(errors="replace")
        expected = ",".join(map(str, record["gpus"]))
        # A packed one-GPU job runs under MPS, where its GPU is named by UUID (launcher/gpus/mps.py).
        named = {expected, ",".join(record.get("gpu_uuids") or ())}
        seen = re.findall(r"devices: (\d+) \[(.*?)\]\s+CUDA_VISIBLE_DEVICES='([^']*)'", log)
        if not seen or any(cvd not in named or int(n) != len(record["gpus"]) for n, _, cvd in seen[:1]):
            failures.append(f"job {job} ({kinds[job]}) saw {seen[:1]} but was given {expected}")
        if kinds[job] == "dataparallel":
            per_gpu = [int(b) for b in re.findall(r"gpu \d+: (\d+) bytes", log)]
            if len(per_gpu) != 2 or min(per_gpu) <= 0:
                failures.append(f"DataParallel job {job}: per-GPU allocations {per_gpu}")
            if dp_gpus.get(job) != set(record["gpus"]):
                failures.append(f"DataParallel job {job}: NVML saw it on GPUs {sorted(dp_gpus.get(job, set()))}")
        ranks = sorted(re.findall(r"rank (\d)/2 device cuda:\d backend nccl", log))
        if kinds[job] == "torchrun" and ranks != ["0", "1"]:
            failures.append(f"torchrun job {job}: ranks not both on NCCL")
    on_gpu0 = [j for j, r in records.items() if 0 in r["gpus"]]
    result = {
        "passed": not failures,
        "failures": failures,
        "jobs": len(records),
        "gpu_totals": totals,
        "foreign_bytes_on_gpu0": foreign_use,
        "jobs_on_gpu0": sorted(on_gpu0),
        "jobs_on_gpu0_kinds": sorted(kinds[j] for j in on_gpu0),
        "nvml_samples": len(samples),
        "max_job_use_over_mem_bytes": max((worst_job_use[j] - mems[j] for j in worst_job_use), default=None),
        "max_job_use_bytes": {j: worst_job_use.get(j) for j in records},
        "peak_mem_recorded": {j: r["peak_mem"] for j, r in records.items()},
        "placements": {j: r["gpus"] for j, r in records.items()},
    }
    print(
        f"crowded queue: {'PASS' if not failures else 'FAIL'}; {len(on_gpu0)} jobs on GPU 0 beside "
        f"{foreign_use / GiB:.1f} GiB foreign; {len(samples)} NVML samples",
        flush=True,
    )
    for failure in failures:
        print("  -", failure, flush=True)
    return result


def packing(work: Path, jobs: int, epochs: int) -> dict[str, Any]:
    makespans = {}
    for label, extra in (("whole_gpu", ()), ("mem_4G", ("--mem", "4G"))):
        gpuq = Gpuq(work / label)
        gpuq("daemon", "start")
        started = time.time()
        for seed in range(jobs):
            gpuq.submit(*extra, "examples/train_digits.py", "--seed", str(seed), "--epochs", str(epochs))
        gpuq("wait")
        records = gpuq.records()
        makespans[label] = max(r["ended_at"] for r in records) - started
        per_gpu = max(sum(1 for r in records if g in r["gpus"]) for g in {g for r in records for g in r["gpus"]})
        print(f"packing {label}: {jobs} jobs in {makespans[label]:.1f}s (busiest GPU ran {per_gpu})", flush=True)
        gpuq("daemon", "stop")
    speedup = makespans["whole_gpu"] / makespans["mem_4G"]
    print(f"packing speedup: {speedup:.2f}x", flush=True)
    return {"jobs": jobs, "epochs": epochs, "makespan_s": makespans, "speedup": round(speedup, 2)}


def fence_only(args: argparse.Namespace, machine: dict[str, Any]) -> None:
    """The learned-memory and fence checks of bench/gpu_fence.py, with the gpu-marked tests."""
    import gpu_fence

    results: dict[str, Any] = {"machine": machine}
    total_gib = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total // GiB
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gpu_fence.write_scripts(work)
        if args.fence:
            results["contract"] = contract()
            results["liar"] = gpu_fence.liar(Gpuq, work, hold_memory, int(total_gib))
            results["non_root"] = gpu_fence.non_root(Gpuq, work)
            results["compute_heavy"] = gpu_fence.compute_heavy(Gpuq, work, 4, 20.0)
            results["kill9"] = gpu_fence.kill_nine(Gpuq, work)
        if args.non_root:
            results["non_root"] = gpu_fence.non_root(Gpuq, work)
        if args.users:
            import gpu_users

            results["two_users"] = gpu_users.two_users(Gpuq, work)
        if args.auto:
            results["auto"] = gpu_fence.ensemble(Gpuq, work, 16, args.epochs, args.settle)
    results["mps_left_at_end"] = gpu_fence.mps_left()
    args.out.mkdir(parents=True, exist_ok=True)
    name = (
        "gpu_fence.json"
        if args.fence
        else "gpu_auto.json"
        if args.auto
        else ("gpu_users.json" if args.users else "gpu_non_root.json")
    )
    (args.out / name).write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1)[-3000:], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--fence", action="store_true", help="only the fence: a liar, MPS vs time-sliced, kill -9")
    parser.add_argument("--auto", action="store_true", help="only --mem auto against whole GPUs and a given --mem")
    parser.add_argument("--non-root", action="store_true", help="only an ordinary user's queue under MPS")
    parser.add_argument("--users", action="store_true", help="only two users' packed jobs on one GPU (MPS, root)")
    parser.add_argument("--settle", type=float, default=5.0, help="GPUQ_AUTO_SETTLE for --auto")
    args = parser.parse_args()
    pynvml.nvmlInit()
    names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    import torch

    machine = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpus": [str(n) for n in names],
        "driver": str(pynvml.nvmlSystemGetDriverVersion()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(machine), flush=True)
    if args.fence or args.auto or args.non_root or args.users:
        fence_only(args, machine)
        return
    results: dict[str, Any] = {"machine": machine, "contract": contract()}
    with tempfile.TemporaryDirectory() as tmp:
        results["crowded"] = crowded_queue(Path(tmp))
        results["packing"] = packing(Path(tmp), 16, args.epochs)
    results["passed"] = results["contract"]["passed"] and results["crowded"]["passed"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_validation.json").write_text(json.dumps(results, indent=1) + "\n")
    print("ALL CHECKS PASSED" if results["passed"] else "SOME CHECKS FAILED", flush=True)


if __name__ == "__main__":
    main()

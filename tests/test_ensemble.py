"""The overnight ensemble example, end to end through a real daemon on fake GPUs (training on the CPU)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT, Gpuq


def test_ensemble_queues_members_waits_and_votes(gpuq: Gpuq) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ensemble.py"), "--members", "3", "--epochs", "4",
         "--mem", "2G", "--out", str(gpuq.cwd / "out dir")],
        env=gpuq.env, cwd=gpuq.cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    members = re.findall(r"member seed +(\d+) +job +(\d+) +gpu (\d) +accuracy (0\.\d+)", result.stdout)
    assert sorted(int(seed) for seed, *_ in members) == [0, 1, 2]
    assert all(float(accuracy) > 0.5 for *_, accuracy in members)
    ensemble = float(re.search(r"ensemble \(majority vote\) accuracy: (0\.\d+)", result.stdout).group(1))  # type: ignore[union-attr]
    assert ensemble > 0.8
    records = {job["id"]: job for job in gpuq.status()}
    for _, job_id, gpu, _ in members:
        record = records[int(job_id)]
        assert record["state"] == "succeeded" and record["gpus"] == [int(gpu)] and record["mem_per_gpu"] == 2 << 30

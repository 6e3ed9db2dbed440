"""The example training scripts, run for real as subprocesses on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def run(*args: str | Path, cwd: Path = REPO, timeout: float = 120) -> str:
    """Run a Python command on the CPU with `launcher` importable; return its stdout, fail on error."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    for name in ("GPUQ_JOB_ID", "GPUQ_GPUS", "GPUQ_MODE", "GPUQ_MEM_PER_GPU", "LOCAL_RANK"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def accuracy_in(output: str) -> float:
    lines = [line for line in output.splitlines() if line.startswith("test accuracy: ")]
    assert len(lines) == 1, output
    return float(lines[0].removeprefix("test accuracy: "))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A directory whose name has a space and a quote, as users' home directories sometimes do."""
    path = tmp_path / "runs of 'digits'"
    path.mkdir()
    return path


def test_train_digits_learns_and_writes_predictions(weird_tmp_path: Path) -> None:
    predictions = weird_tmp_path / "seed 3.json"
    summary = weird_tmp_path / "summary.json"

    # From another directory: the script finds digits_model beside itself.
    output = run(
        EXAMPLES / "train_digits.py",
        "--seed",
        "3",
        "--predictions",
        predictions,
        "--out-json",
        summary,
        cwd=weird_tmp_path,
    )

    assert output.startswith("device: cpu  devices: 0 []  CUDA_VISIBLE_DEVICES=''\n")
    assert accuracy_in(output) >= 0.9
    assert "max memory allocated: 0 bytes" in output
    written = json.loads(predictions.read_text())
    assert written["accuracy"] == pytest.approx(accuracy_in(output), abs=1e-4)
    assert len(written["predictions"]) == len(written["labels"]) == 360
    assert set(written["predictions"]) <= set(range(10))
    assert json.loads(summary.read_text())["device"] == "cpu"


def test_every_seed_is_tested_on_the_same_images(monkeypatch: pytest.MonkeyPatch) -> None:
    # Ensemble members differ only in --seed; their predictions can be voted on only if they share a test set.
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import digits_model

    test_sets = []
    for seed in (1, 2):
        digits_model.seed_everything(seed)
        test_sets.append(digits_model.load_data()[1].tensors)

    (images_1, labels_1), (images_2, labels_2) = test_sets
    assert images_1.equal(images_2) and labels_1.equal(labels_2)
    assert len(labels_1) == 360


def test_train_digits_resumes_from_its_checkpoint_as_if_never_stopped(weird_tmp_path: Path) -> None:
    checkpoint = weird_tmp_path / "digits.pt"
    straight, resumed = weird_tmp_path / "straight.json", weird_tmp_path / "resumed.json"

    first = run(EXAMPLES / "train_digits.py", "--epochs", "2", "--checkpoint", checkpoint)
    second = run(EXAMPLES / "train_digits.py", "--epochs", "4", "--checkpoint", checkpoint, "--predictions", resumed)
    run(EXAMPLES / "train_digits.py", "--epochs", "4", "--predictions", straight)

    assert "resumed from epoch" not in first
    assert "resumed from epoch 2\n" in second
    assert "epoch 1/4" not in second and "epoch 3/4" in second
    assert json.loads(resumed.read_text())["predictions"] == json.loads(straight.read_text())["predictions"]
    assert [p.name for p in weird_tmp_path.iterdir() if p.suffix == ".tmp"] == []


def test_train_dataparallel_runs_on_the_cpu() -> None:
    output = run(EXAMPLES / "train_dataparallel.py", "--epochs", "12")

    assert "model: DigitsCNN" in output
    assert accuracy_in(output) >= 0.85


def test_train_ddp_runs_two_gloo_ranks_under_torchrun(weird_tmp_path: Path) -> None:
    summary = weird_tmp_path / "ddp summary.json"

    output = run(
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        EXAMPLES / "train_ddp.py",
        "--epochs",
        "10",
        "--out-json",
        summary,
    )

    assert "rank 0/2 device cpu backend gloo" in output
    assert "rank 1/2 device cpu backend gloo" in output
    assert accuracy_in(output) >= 0.85
    assert json.loads(summary.read_text())["world_size"] == 2


def test_importing_the_allocation_helper_does_not_import_torch() -> None:
    code = "import sys, gpuq_scheduler.jobs.allocation; print(sorted({'torch', 'pynvml'} & set(sys.modules)))"

    assert run("-c", code).strip() == "[]"

"""What the digits examples share: data, model, one training epoch, evaluation, atomic writes.

The data is scikit-learn's bundled digits set (1,797 8x8 images, 10 classes), so nothing is downloaded.
The train/test split is fixed and does not depend on --seed: every member of an ensemble is tested on
the same images, which is what lets their predictions be majority-voted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

if TYPE_CHECKING:
    from gpuq_scheduler.jobs.allocation import Allocation

TEST_FRACTION = 0.2
SPLIT_SEED = 0


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions and a linear layer over a 1x8x8 image; about 12k parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 4 * 4, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(images).flatten(1))
        return logits


def load_data() -> tuple[TensorDataset, TensorDataset]:
    """The train and test sets: images as float (N, 1, 8, 8) in [0, 1], labels as int64."""
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # pixel values are 0..16
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=digits.target
    )

    def dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y).long())

    return dataset(x_train, y_train), dataset(x_test, y_test)


def common_arguments(description: str, epochs: int, batch_size: int, lr: float) -> argparse.ArgumentParser:
    """The arguments every digits example takes, with that example's defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=epochs, help=f"epochs to train (default {epochs})")
    parser.add_argument("--batch-size", type=int, default=batch_size, help=f"default {batch_size}")
    parser.add_argument("--lr", type=float, default=lr, help=f"Adam learning rate (default {lr})")
    parser.add_argument("--seed", type=int, default=0, help="seeds weights and batch order (default 0)")
    parser.add_argument("--disable-cuda", action="store_true", help="train on the CPU even if CUDA is there")
    parser.add_argument("--out-json", type=Path, help="write a summary of the run (accuracy, timings) here")
    return parser


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def gpuq_allocation() -> Allocation | None:
    """What gpuq gave this job, or None when gpuq is not installed (plain PyTorch rules then apply)."""
    try:
        from gpuq_scheduler.jobs.allocation import current
    except ImportError:
        return None
    return current()


def describe_devices(device: torch.device) -> str:
    """One line: the device used, the GPUs this process can see, and CUDA_VISIBLE_DEVICES."""
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f"device: {device}  devices: {len(names)} {names}  CUDA_VISIBLE_DEVICES={visible!r}"


def loader(dataset: TensorDataset, batch_size: int, device: torch.device, **options: Any) -> DataLoader[Any]:
    # Pinned host memory is what lets .to(device, non_blocking=True) overlap the copy with compute.
    return DataLoader(dataset, batch_size=batch_size, pin_memory=device.type == "cuda", **options)


def train_one_epoch(
    model: nn.Module, batches: DataLoader[Any], optimizer: torch.optim.Optimizer, device: torch.device
) -> float:
    """Train for one pass over `batches`; return the mean loss."""
    model.train()
    total_loss, count = 0.0, 0
    for images, labels in batches:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        total_loss += loss.item() * len(labels)
        count += len(labels)
    return total_loss / max(count, 1)


@torch.no_grad()
def evaluate(model: nn.Module, batches: DataLoader[Any], device: torch.device) -> tuple[float, list[int]]:
    """Return (accuracy, predicted class of every example, in order)."""
    model.eval()
    predictions: list[int] = []
    correct = 0
    for images, labels in batches:
        predicted = model(images.to(device, non_blocking=True)).argmax(dim=1).cpu()
        correct += int((predicted == labels).sum())
        predictions.extend(predicted.tolist())
    return correct / max(len(predictions), 1), predictions


def max_memory_allocated(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def atomic_save(write: Callable[[IO[bytes]], object], path: Path) -> None:
    """Write a file through `write(file)` so that `path` holds either the old or the whole new content.

    gpuq may kill or requeue a job at any moment; a half-written checkpoint would make the retry fail.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_save(lambda file: file.write(json.dumps(data).encode() + b"\n"), path)

"""`gpuq jupyter install-kernel`: a Jupyter kernel whose every start goes through `gpuq run`
(``launcher.cli.interactive``), so each notebook waits its turn and holds its GPUs as a job. Installing
one only writes its kernel.json: nothing is queued here.
"""

from __future__ import annotations

import json
import os
import sys

import click

from gpuq_scheduler.jobs.errors import BadInput


@click.group()
def jupyter() -> None:
    """Notebooks whose kernels take their GPUs from the queue."""


@jupyter.command("install-kernel")
@click.option("--gpus", type=int, default=1, show_default=True, help="GPUs each kernel holds.")
@click.option("--mem", help="Memory on each GPU (16G); without it, whole GPUs.")
@click.option("--time", "time_limit", help="Time limit of each kernel (8h); then it is stopped.")
@click.option("--name", "kernel", default="", help="The kernel's folder name (default: gpuq-1gpu, gpuq-1gpu-16g).")
@click.option("--python", "python", default=sys.executable, show_default=True, help="The Python that runs the kernel.")
@click.option("--reservation", metavar="NAME", help="Each kernel runs in this reservation of yours (`gpuq reserve`).")
def install_kernel(
    gpus: int, mem: str | None, time_limit: str | None, kernel: str, python: str, reservation: str | None
) -> None:
    """Add a Jupyter kernel that starts through `gpuq run`: each notebook waits its turn, then holds its GPUs
    as a job of yours (in `gpuq status` and `gpuq gpus`) until the kernel shuts down."""
    from gpuq_scheduler.jobs.reservations import check_name
    from gpuq_scheduler.jobs.units import parse_duration, parse_size

    size = parse_size(mem) if mem else None
    if gpus < 1:
        raise BadInput(f"--gpus {gpus}: a GPU kernel holds at least one GPU")
    if time_limit:
        parse_duration(time_limit)
    folder = kernel or f"gpuq-{gpus}gpu" + (f"-{mem.lower()}" if mem else "")
    if not folder.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise BadInput(f"--name {folder!r}: use letters, digits, '-', '_' and '.'")
    shape = f"{gpus} GPU{'s' if gpus > 1 else ''}" + (f", {mem} each" if size else "")
    argv = [
        sys.executable,
        "-m",
        "gpuq_scheduler.launcher.cli.entry",
        "run",
        "--gpus",
        str(gpus),
        "--name",
        f"jupyter-{folder}",
        *(["--mem", mem] if mem else []),
        *(["--time", time_limit] if time_limit else []),
        *(["--reservation", check_name(reservation)] if reservation else []),
        "--",
        python,
        "-m",
        "ipykernel_launcher",
        "-f",
        "{connection_file}",
    ]
    spec = {
        "argv": argv,
        "display_name": f"Python (gpuq, {shape})",
        "language": "python",
        "metadata": {"debugger": False},
    }
    home = os.environ.get("JUPYTER_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share"), "jupyter"
    )
    target = os.path.join(home, "kernels", folder)
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "kernel.json"), "w") as handle:
        handle.write(json.dumps(spec, indent=1) + "\n")
    click.echo(f"installed kernel {folder!r} ({spec['display_name']}) in {target}")

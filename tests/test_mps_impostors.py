"""Processes that look like gpuq's MPS control daemons and servers (issue 38's trust table): a command name
and ``CUDA_MPS_PIPE_DIRECTORY`` are all the daemon knew them by, and any user can start a process with
both. A teammate's impostor named ``nvidia-cuda-mps-server`` with another user's pipe directory had its GPU
memory counted as gpuq's fence, hidden from placement; one named ``nvidia-cuda-mps-control`` made a control
daemon that had quit look alive. Now each is believed only of the user whose pipe directory it names (the
kernel's real uid of the process), or of root.

Real Unix users (created here, removed after; run as root, as CI does, under `flock /tmp/gpuq-users.lock`),
against ``launcher.gpus.mps`` as the daemon calls it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq_scheduler.launcher.gpus.mps import Key, Mps, server_pids
from tests.conftest import wait_for
from tests.test_shared import HAS_TOOLS, User, unix_users

NAMES = ("gqqalice", "gqqmallory")

pytestmark = pytest.mark.skipif(
    not HAS_TOOLS and not os.environ.get("CI"), reason="needs root and useradd to create real users"
)
NAMED = "exec -a {name} sleep 300"  # a process of that name, as any user can make one


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users(NAMES, admins=None) as found:
        yield found


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    running: list[subprocess.Popen[bytes]] = []
    yield running
    for process in running:
        process.kill()
        process.wait()


def _as(user: User, name: str, pipe: Path, running: list[subprocess.Popen[bytes]]) -> int:
    """Start, as ``user``, a process named ``name`` whose environment names ``pipe``; its pid once it is so named."""
    process = subprocess.Popen(
        ["bash", "-c", NAMED.format(name=name)],
        env={"PATH": os.defpath, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
        cwd="/",
        user=user.uid,
        group=user.gid,
        extra_groups=[],
    )
    running.append(process)
    wait_for(lambda: Path(f"/proc/{process.pid}/cmdline").read_bytes().startswith(name.encode()), 10, f"{name}")
    return process.pid


def test_a_teammates_process_named_as_another_users_mps_is_not_taken_for_gpuqs(
    users: dict[str, User], tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    alice, mallory = users["gqqalice"], users["gqqmallory"]
    root = tmp_path / "mps"
    mps = Mps(root, binary="/bin/true")
    key = Key("GPU-fake-0000", alice.uid)
    pipe = mps.pipe(key)
    control = _as(mallory, "nvidia-cuda-mps-control", pipe, started)
    server = _as(mallory, "nvidia-cuda-mps-server", pipe, started)
    assert not mps.alive(key), f"mallory's process {control} passed for alice's control daemon"
    assert server_pids(root, [server]) == set(), "mallory's process passed for alice's MPS server"
    # Alice's own, as her control daemon and its server run: believed.
    hers = _as(alice, "nvidia-cuda-mps-server", pipe, started)
    _as(alice, "nvidia-cuda-mps-control", pipe, started)
    assert mps.alive(key)
    assert server_pids(root, [server, hers]) == {hers}

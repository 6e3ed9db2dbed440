"""A private single-node Slurm on loopback with a fake 4-GPU GRES, for benchmarks and tests.

    from tests.slurm_local import LocalSlurm

    with LocalSlurm(gpus=4) as slurm:          # writes configs, starts slurmctld + slurmd, waits for idle
        out = slurm.run("sbatch", "--parsable", "--gres=gpu:2", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
        ...                                    # slurm.env has SLURM_CONF; any slurm command works with it
    # daemons stopped, jobs cancelled, temp dir removed

    python tests/slurm_local.py --smoke        # one sbatch --gres=gpu:2 job; prints its CUDA_VISIBLE_DEVICES

Needs root (the daemons run jobs as their submitter, and the GPU "devices" are character devices made
with mknod: Slurm refuses regular files) and Debian's ``slurmctld slurmd slurm-client``. No munge, no
systemd, no system-wide config: everything lives in one temp dir that ``SLURM_CONF`` points at, on
ports picked free at start, so several instances (and a system Slurm) can coexist.

What was found to work here (Slurm 22.05): ``AuthType=auth/none`` + ``CredType=cred/none``,
``select/cons_tres`` (with ``CR_Core``, so memory is not a consumable that would serialise jobs),
``proctrack/linuxproc``, ``task/none``, ``GresTypes=gpu``, ``SlurmdParameters=config_overrides`` so the
node may claim more CPUs than the machine has, and a gres.conf with ``AutoDetect=off``.

``tuned=True`` (the default) is what an admin would set for a queue of short jobs:
``SchedulerParameters=batch_sched_delay=0`` and a no-op ``Epilog=/bin/true``; together they turn a
~0.8 s gap after each job into ~50 ms (stock defaults leave ~2.6 s). ``tuned=False`` leaves the stock ones.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

NVIDIA_MAJOR = 195  # the character-device major number of /dev/nvidiaN
REQUIRED = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


class SlurmError(RuntimeError):
    pass


def missing_commands() -> list[str]:
    """The Slurm commands not on PATH (``apt-get install slurmctld slurmd slurm-client`` brings them)."""
    return [name for name in REQUIRED if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def version() -> str:
    try:
        out = subprocess.run([_binary("slurmctld"), "-V"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out or "unknown"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class LocalSlurm:
    """A context manager around one private slurmctld + slurmd pair (see the module docstring)."""

    def __init__(
        self,
        *,
        gpus: int = 4,
        cpus: int = 16,
        tuned: bool = True,
        node: str = "gpuqbench",
        partition: str = "bench",
        extra_conf: Sequence[str] = (),
        root: str | os.PathLike[str] | None = None,
        keep: bool = False,
        start_timeout: float = 60.0,
    ) -> None:
        self.gpus = gpus
        self.cpus = cpus
        self.tuned = tuned
        self.node = node
        self.partition = partition
        self.extra_conf = list(extra_conf)
        self._root_arg = root
        self.keep = keep
        self.start_timeout = start_timeout
        self.root = Path()
        self.env: dict[str, str] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._own_root = False

    # -- the parts a caller uses -------------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def devices(self) -> list[Path]:
        return [self.root / "dev" / f"nvidia{i}" for i in range(self.gpus)]

    def run(self, *args: str, check: bool = True, timeout: float = 60.0) -> str:
        """Run a Slurm command against this instance; returns its stdout."""
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise SlurmError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout}")
        return proc.stdout

    def sbatch(self, *args: str, env: Mapping[str, str] | None = None) -> int:
        """Submit with ``sbatch --parsable ARGS...`` and return the job id."""
        proc = subprocess.run(
            ["sbatch", "--parsable", *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if proc.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def queue_empty(self) -> bool:
        return not self.run("squeue", "-h", "-o", "%i", check=False).strip()

    def wait_empty(self, timeout: float = 120.0, poll: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.queue_empty():
                return
            time.sleep(poll)
        raise SlurmError(f"jobs still queued after {timeout:.0f}s:\n{self.run('squeue', check=False)}")

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T", check=False).strip()

    def hold_partition(self) -> None:
        """Queue without starting: new and pending jobs wait until ``release_partition``."""
        self.run("scontrol", "update", f"PartitionName={self.partition}", "State=DOWN")

    def release_partition(self) -> None:
        self.run("scontrol", "update", f"PartitionName={self.partition}", "State=UP")

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(out)

    # -- set-up and tear-down ----------------------------------------------------------------------

    def __enter__(self) -> LocalSlurm:
        missing = missing_commands()
        if missing:
            raise SlurmError(
                f"Slurm is not installed (missing {', '.join(missing)}): apt-get install slurmctld slurmd slurm-client"
            )
        if os.geteuid() != 0:
            raise SlurmError("a private Slurm needs root: slurmd runs jobs as their submitter and mknod needs it")
        if self._root_arg is None:
            self.root = Path(tempfile.mkdtemp(prefix="slurm-local-"))
            self._own_root = True
        else:
            self.root = Path(self._root_arg)
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            self._write_config()
            self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self._procs.get("slurmctld") is not None and self._procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run("scancel", "--quiet", "--full", f"--partition={self.partition}", check=False, timeout=10)
                self.wait_empty(timeout=10, poll=0.1)
        for name in ("slurmd", "slurmctld"):
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._own_root and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def _write_config(self) -> None:
        root = self.root
        for sub in ("state", "spool", "dev"):
            (root / sub).mkdir(exist_ok=True)
        for index, device in enumerate(self.devices):
            if not device.exists():
                os.mknod(device, 0o600 | 0o020000, os.makedev(NVIDIA_MAJOR, index))  # S_IFCHR
        host = socket.gethostname().split(".")[0]
        lines = [
            f"ClusterName={self.node}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd.pid'}",
            f"SlurmctldLogFile={root / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'slurmd.log'}",
            f"PlugStackConfig={root / 'plugstack.conf'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MailProg=/bin/true",
            "MaxJobCount=200000",
        ]
        if self.tuned:
            lines += ["SchedulerParameters=batch_sched_delay=0", "Epilog=/bin/true"]
        lines += self.extra_conf
        lines += [
            f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={self.cpus} "
            f"Gres=gpu:{self.gpus} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        first, last = 0, self.gpus - 1
        device_glob = root / "dev" / (f"nvidia[{first}-{last}]" if self.gpus > 1 else "nvidia0")
        (root / "gres.conf").write_text(f"AutoDetect=off\nNodeName={self.node} Name=gpu File={device_glob}\n")
        (root / "plugstack.conf").write_text("")
        (root / "cgroup.conf").write_text("")

    def _start(self) -> None:
        for name, argv in (
            ("slurmctld", [_binary("slurmctld"), "-D", "-i"]),
            ("slurmd", [_binary("slurmd"), "-D", "-N", self.node]),
        ):
            out = (self.root / f"{name}.stdout").open("wb")
            self._procs[name] = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            out.close()
            if name == "slurmctld":
                self._wait(lambda: self.run("scontrol", "ping", check=False).find("UP") >= 0, "slurmctld to answer")
        self._wait(lambda: self.node_state().rstrip("*") == "idle", f"node {self.node} to be idle")

    def _wait(self, ready: object, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise SlurmError(f"{name} exited ({proc.returncode}) while waiting for {what}\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.1)
        raise SlurmError(f"timed out after {self.start_timeout:.0f}s waiting for {what}\n{self.log_tail()}")


def smoke() -> int:
    """One sbatch job with --gres=gpu:2: print what it saw."""
    started = time.monotonic()
    with LocalSlurm(gpus=4) as slurm:
        up = time.monotonic() - started
        print(f"{version()}: node {slurm.node} idle after {up:.1f}s (SLURM_CONF={slurm.conf})")
        print(slurm.run("sinfo", "-N", "-o", "%N %T %c %G").rstrip())
        out = slurm.root / "smoke.out"
        job = slurm.sbatch(
            "--gres=gpu:2",
            f"--output={out}",
            "--wrap",
            'echo "job $SLURM_JOB_ID CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"',
        )
        slurm.wait_empty(timeout=60)
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = out.read_text().strip() if out.exists() else ""
        print(f"sbatch --gres=gpu:2 -> job {job}: {text or '(no output)'}")
        ids = text.rsplit("=", 1)[-1].split(",") if "=" in text else []
        ok = len(ids) == 2 and all(i.isdigit() for i in ids)
    print("smoke test passed" if ok else "smoke test FAILED: expected two GPU ids")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="run one --gres=gpu:2 job and print what it saw")
    parser.add_argument("--shell", action="store_true", help="start one and open a shell with SLURM_CONF set")
    args = parser.parse_args(argv)
    try:
        if args.shell:
            with LocalSlurm() as slurm:
                print(f"SLURM_CONF={slurm.conf}; exit the shell to tear it down")
                return subprocess.call([os.environ.get("SHELL", "/bin/sh")], env=slurm.env)
        return smoke()
    except SlurmError as err:
        print(f"slurm_local: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

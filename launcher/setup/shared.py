"""Setting up a shared queue: one root daemon that serves every user of the machine.

    sudo gpuq daemon setup --admins gpuq-admin    # /etc/gpuq/config.toml, /var/lib/gpuq, the systemd unit
    sudo systemctl enable --now gpuq               # or `sudo gpuq daemon start --shared` to try it out

The config names the queue's home, so users' `gpuq` finds the shared queue with no set-up of their own.
"""

from __future__ import annotations

import grp
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from gpuq_scheduler.jobs import config
from gpuq_scheduler.jobs.errors import BadInput, DaemonError
from gpuq_scheduler.jobs.store.atomic import write_atomic
from gpuq_scheduler.jobs.store.statedir import StateDir

UNIT_DIR = Path("/etc/systemd/system")  # $GPUQ_UNIT_DIR overrides it (tests, or a distribution's own layout)


def unit(python: str | None = None, home: Path | None = None) -> str:
    """The systemd unit of a shared queue's daemon."""
    home_flag = f" --home {home}" if home else ""
    return f"""[Unit]
Description=gpuq: the shared GPU job queue of this machine
After=local-fs.target

[Service]
ExecStart={python or sys.executable} -m gpuq_scheduler.launcher.daemon --shared{home_flag}
Restart=always
RestartSec=1
# Jobs run under their own supervisors in the daemon's cgroup: stopping or restarting the daemon must not
# kill them (the next daemon adopts them), so only the daemon's own process is signalled.
KillMode=process

[Install]
WantedBy=multi-user.target
"""


@dataclass(frozen=True)
class SetupResult:
    home: Path
    config: Path
    wrote_config: bool
    unit: Path | None


def setup(admins: str | None, home: Path | None, config_path: Path | None = None) -> SetupResult:
    """Write the system config (unless one exists), create the shared state directory, install the unit."""
    if os.geteuid() != 0:
        raise DaemonError("setting up a shared queue needs root: run it with sudo")
    if admins is not None:
        try:
            grp.getgrnam(admins)
        except KeyError:
            raise BadInput(f"no group {admins!r} on this machine; create it first (`groupadd {admins}`)") from None
    path = config_path or config.config_paths()[0]
    wrote = False
    if not path.exists():
        lines = [f'home = "{home or config.SHARED_HOME}"', "", "[shared]"]
        if admins:
            lines.append(f'admins = "{admins}"  # may cancel, hold or update anyone\'s job')
        lines += [
            "max_gpus_per_user = 4  # GPUs one user may hold at once: about half of this machine's is a fair start",
            "max_queued_per_user = 1000  # jobs one user may have waiting",
            'default_time = "24h"  # the time limit of a job submitted without --time',
            'max_time = "7d"  # the longest --time a job may ask for',
            'idle_limit = "4h"  # `gpuq run`/`alloc` jobs whose GPUs do nothing this long are released',
            'idle_report = "2h"  # batch jobs whose GPUs do nothing this long are shown in status and doctor',
            "default_pids = 4096  # processes (threads too) one job may hold at once: a fork bomb stops there",
            "max_pids = 32768  # the most --pids a job may ask for",
            '# fair_share_half_life = "24h"',
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, ("\n".join(lines) + "\n").encode(), mode=0o644)
        wrote = True
    settings = config.load()
    state = StateDir(home or settings.home or config.SHARED_HOME)
    state.ensure_shared()
    unit_path = Path(os.environ.get("GPUQ_UNIT_DIR") or UNIT_DIR) / "gpuq.service"
    if not unit_path.parent.is_dir():
        return SetupResult(state.root, path, wrote, None)  # no systemd here
    write_atomic(unit_path, unit(home=home).encode(), mode=0o644)
    return SetupResult(state.root, path, wrote, unit_path)

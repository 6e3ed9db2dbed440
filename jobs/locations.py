"""Where gpuq looks outside a state directory: its config files and a shared queue's default home.

Apart from ``jobs.config`` so that finding out whether there is a config file at all costs no more than
a ``stat``: a machine without one never imports the config's parser and dataclasses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SYSTEM_CONFIG = Path("/etc/gpuq/config.toml")
SHARED_HOME = Path("/var/lib/gpuq")  # a shared queue's state directory unless the config names another


def config_paths(env: Mapping[str, str] | None = None) -> tuple[Path, Path]:
    """(system file, user file), lowest precedence first."""
    env = os.environ if env is None else env
    system = Path(env.get("GPUQ_SYSTEM_CONFIG") or SYSTEM_CONFIG)
    if env.get("GPUQ_CONFIG"):
        user = Path(env["GPUQ_CONFIG"]).expanduser()
    else:
        base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        user = Path(base) / "gpuq" / "config.toml"
    return system, user


def any_config(env: Mapping[str, str] | None = None) -> bool:
    """Whether there may be a config file to read: False only when each one is plainly absent (anything
    else, an unreadable directory say, is for ``jobs.config.load`` to report)."""
    for path in config_paths(env):
        try:
            os.stat(path)
        except FileNotFoundError:
            continue
        except OSError:
            pass  # there, but it cannot be looked at: jobs.config.load says so
        return True
    return False

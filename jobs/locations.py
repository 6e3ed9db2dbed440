"""Where gpuq looks outside a state directory: its config files and a shared queue's default home.

Apart from ``jobs.config`` so that finding out whether there is a config file at all costs no more than
a ``stat``: a machine without one never imports the config's parser and dataclasses.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

SYSTEM_CONFIG = "/etc/gpuq/config.toml"
SHARED_HOME = "/var/lib/gpuq"  # a shared queue's state directory unless the config names another


def _config_files(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(system file, user file) as strings: ``gpuq submit`` looks for them without importing pathlib."""
    env = os.environ if env is None else env
    system = env.get("GPUQ_SYSTEM_CONFIG") or SYSTEM_CONFIG
    if env.get("GPUQ_CONFIG"):
        user = os.path.expanduser(env["GPUQ_CONFIG"])
    else:
        base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        user = os.path.join(base, "gpuq", "config.toml")
    return system, user


def config_paths(env: Mapping[str, str] | None = None) -> tuple[Path, Path]:
    """(system file, user file), lowest precedence first."""
    from pathlib import Path

    system, user = _config_files(env)
    return Path(system), Path(user)


def any_config(env: Mapping[str, str] | None = None) -> bool:
    """Whether there may be a config file to read: False only when each one is plainly absent (anything
    else, an unreadable directory say, is for ``jobs.config.load`` to report)."""
    for path in _config_files(env):
        try:
            os.stat(path)
        except FileNotFoundError:
            continue
        except OSError:
            pass  # there, but it cannot be looked at: jobs.config.load says so
        return True
    return False

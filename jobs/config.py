"""gpuq's configuration: which queue to use, how a shared queue is run, which clusters exist.

Two TOML files, both optional; the user's overrides the system's key by key (clusters by name):

    /etc/gpuq/config.toml            written by the admin of a shared machine ($GPUQ_SYSTEM_CONFIG)
    ~/.config/gpuq/config.toml       the user's own ($GPUQ_CONFIG, or under $XDG_CONFIG_HOME)

    home = "/var/lib/gpuq"           # the state directory, i.e. the queue ($GPUQ_HOME wins over it)

    [shared]                         # read by a daemon started with --shared
    admins = "gpuq-admin"            # members of this group may cancel, hold or update anyone's job
    max_gpus_per_user = 4            # GPUs one user's running jobs may hold at once
    max_queued_per_user = 1000       # jobs one user may have waiting (default 10000)
    default_time = "24h"             # the time limit of a job submitted without --time (default: none)
    max_time = "7d"                  # the longest --time a job may ask for (default 7d; "off": no maximum)
    idle_report = "2h"               # batch jobs whose GPUs did no work this long are shown (default 2h; "off")
    fair_share_half_life = "24h"     # how fast past GPU use is forgotten
    idle_limit = "4h"                # `gpuq run`/`alloc` jobs whose GPUs did no work this long are released ("off")
    default_cpus = 8                 # --cpus of a job that gives none (host limits: docs/containment.md)
    default_ram = "64G"              # --ram of a job that gives none
    default_pids = 4096              # --pids of a job that gives none (default 4096; "off": no limit)
    max_pids = 32768                 # the most --pids a job may ask for (default 32768; "off": no maximum)
    preemption = true                # a waiting job may suspend preemptible running jobs (default false)
    preemption_min_runtime = "10m"   # a job runs this long after it (re)started before it may be preempted
    preemption_by = ["priority"]     # also preemptible beyond --preemptible: "priority", "fair_share"
    preemption_grace = "60s"         # a job that cannot be suspended gets its signal, then this long, then requeue
    [shared.priority]                # users with a higher number go first; default 0
    alice = 10                       # (a job's own --priority orders only its user's jobs)

    [watchdog]                       # what gpuq does to a job that takes what it was not given (docs/watchdog.md)
    other_gpu = "stop"               # its process on a GPU it was not given: "stop" (the default) or "warn"
    past_share = "stop"              # a packed job past its --mem share (plus the context and tolerance)
    leftover = "stop"                # a process of an ended job still on a GPU: "stop" ends it
    tolerance = "256M"               # how far past share + context a sample may show before the rule applies

    [status]                         # `gpuq status` (your own config, most likely)
    format = "id,name,state,gpus,on,runtime,peak_mem"   # its columns unless --format says (see --format help)

    [clusters.lab]                   # `gpuq submit --on lab ...`
    backend = "slurm"
    partition = "gpu"
    account = "ml-team"
    time = "4h"                      # default --time for jobs sent there
    sbatch_flags = ["--qos=normal"]

Files are read only when they exist, so a machine without one pays nothing (no TOML import).
Every mistake is one line naming the file and the key, and exits with code 2. What each setting is, and
its default, is ``jobs.settings``; this module reads the files into it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq_scheduler.jobs import locations
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.locations import config_paths as config_paths
from gpuq_scheduler.jobs.rules import MAX_CPUS, check_update
from gpuq_scheduler.jobs.settings import BACKENDS, PREEMPTION_BY, WATCHDOG_ACTIONS
from gpuq_scheduler.jobs.settings import Cluster as Cluster  # a config's parts, by the names its readers import
from gpuq_scheduler.jobs.settings import Shared as Shared
from gpuq_scheduler.jobs.settings import Status as Status
from gpuq_scheduler.jobs.settings import Watchdog as Watchdog
from gpuq_scheduler.jobs.units import parse_duration, parse_size

SHARED_HOME = Path(locations.SHARED_HOME)  # a shared queue's state directory unless the config names another
SYSTEM_CONFIG = Path(locations.SYSTEM_CONFIG)


class ConfigError(BadInput):
    """A config file that cannot be used: the message names the file and the key."""


@dataclass(frozen=True)
class Config:
    home: Path | None = None
    shared: Shared = field(default_factory=Shared)
    watchdog: Watchdog = field(default_factory=Watchdog)
    clusters: Mapping[str, Cluster] = field(default_factory=dict)
    status: Status = field(default_factory=Status)
    sources: tuple[Path, ...] = ()  # the files it was read from, for messages

    def cluster(self, name: str) -> Cluster:
        found = self.clusters.get(name)
        if found is None:
            known = ", ".join(sorted(self.clusters)) or "none are configured"
            where = " or ".join(str(p) for p in config_paths())
            raise ConfigError(f"no cluster named {name!r} (known: {known}); add [clusters.{name}] to {where}")
        return found


def load(env: Mapping[str, str] | None = None) -> Config:
    """The merged configuration (an empty one when neither file exists)."""
    merged: dict[str, Any] = {}
    sources: list[Path] = []
    for path in config_paths(env):
        raw = _read(path)
        if raw is None:
            continue
        sources.append(path)
        _check_keys(raw, {"home", "shared", "clusters", "watchdog", "status"}, path, "")
        for key, value in raw.items():
            tables = ("shared", "clusters", "watchdog", "status")
            if key in tables and isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        merged.setdefault("_where", {}).update({k: path for k in raw})
    return _build(merged, tuple(sources))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a config file") from None
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    try:
        parsed: dict[str, Any] = tomllib.loads(data.decode("utf-8"))
        return parsed
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text; it must be a TOML file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"{path} is nested too deeply to be a gpuq config") from None


def _build(raw: dict[str, Any], sources: tuple[Path, ...]) -> Config:
    where: dict[str, Path] = raw.pop("_where", {})
    home = raw.get("home")
    if home is not None:
        home = Path(_typed(home, str, where.get("home"), "home")).expanduser()
        if not home.is_absolute():
            raise ConfigError(f"{where.get('home')}: home must be an absolute path, not {str(home)!r}")
    shared = _shared(raw.get("shared", {}), where.get("shared"))
    clusters_raw = raw.get("clusters", {})
    if not isinstance(clusters_raw, dict):
        raise ConfigError(f"{where.get('clusters')}: [clusters] must be a table of [clusters.NAME] tables")
    clusters = {name: _cluster(name, value, where.get("clusters")) for name, value in clusters_raw.items()}
    watchdog = _watchdog(raw.get("watchdog", {}), where.get("watchdog"))
    status = _status(raw.get("status", {}), where.get("status"))
    return Config(home=home, shared=shared, clusters=clusters, sources=sources, watchdog=watchdog, status=status)


def _status(raw: Any, path: Path | None) -> Status:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [status] must be a table")
    _check_keys(raw, {"format"}, path, "status.")
    return Status(_optional(raw.get("format"), str, path, "status.format"), path)


def _shared(raw: Any, path: Path | None) -> Shared:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [shared] must be a table")
    _check_keys(
        raw,
        {
            "admins",
            "max_gpus_per_user",
            "max_queued_per_user",
            "fair_share_half_life",
            "priority",
            "idle_limit",
            "default_time",
            "max_time",
            "idle_report",
            "default_cpus",
            "default_ram",
            "default_pids",
            "max_pids",
            "preemption",
            "preemption_min_runtime",
            "preemption_by",
            "preemption_grace",
            "reservation_idle",
            "reservation_quota",
            "outside_notify",
        },
        path,
        "shared.",
    )
    priority = raw.get("priority", {})
    if not isinstance(priority, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and -1_000_000 <= v <= 1_000_000 for v in priority.values()
    ):
        raise ConfigError(f"{path}: [shared.priority] maps user names to whole numbers from -1000000 to 1000000")
    half_life = raw.get("fair_share_half_life", "24h")
    try:
        seconds = parse_duration(_typed(half_life, str, path, "shared.fair_share_half_life"))
    except ConfigError:
        raise
    except BadInput as err:
        raise ConfigError(f"{path}: shared.fair_share_half_life: {err}") from None
    idle = _typed(raw.get("idle_limit", "4h"), str, path, "shared.idle_limit")
    try:
        idle_limit = None if idle == "off" else parse_duration(idle)
    except BadInput as err:
        raise ConfigError(f'{path}: shared.idle_limit: {err} (or "off")') from None
    default_time = _duration(raw.get("default_time", "off"), path, "shared.default_time")
    max_time = _duration(raw.get("max_time", "7d"), path, "shared.max_time")
    if default_time is not None and max_time is not None and default_time > max_time:
        raise ConfigError(f"{path}: shared.default_time is longer than shared.max_time; shorten it")
    cpus = raw.get("default_cpus")
    numeric = isinstance(cpus, int | float) and not isinstance(cpus, bool)
    if cpus is not None and not (numeric and 0.01 <= cpus <= MAX_CPUS):
        raise ConfigError(f"{path}: shared.default_cpus must be a number of CPUs from 0.01 to {MAX_CPUS}, like 8")
    ram = _optional(raw.get("default_ram"), str, path, "shared.default_ram")
    try:
        ram_bytes = None if ram is None else parse_size(ram)
    except BadInput as err:
        raise ConfigError(f"{path}: shared.default_ram: {err}") from None
    if ram_bytes is not None and not 1 << 20 <= ram_bytes < 1 << 60:
        raise ConfigError(f'{path}: shared.default_ram must be at least 1M, like "64G"')
    default_pids, max_pids = _pids(raw, "default_pids", 4096, path), _pids(raw, "max_pids", 32768, path)
    if default_pids is not None and max_pids is not None and default_pids > max_pids:
        raise ConfigError(f"{path}: shared.default_pids is more than shared.max_pids; lower it")
    by = raw.get("preemption_by", [])
    if not isinstance(by, list) or not all(isinstance(b, str) and b in PREEMPTION_BY for b in by):
        raise ConfigError(f'{path}: shared.preemption_by lists "priority" and/or "fair_share", like ["priority"]')
    min_runtime = _duration(raw.get("preemption_min_runtime", "10m"), path, "shared.preemption_min_runtime")
    return Shared(
        preemption=_typed(raw.get("preemption", False), bool, path, "shared.preemption"),
        preemption_min_runtime=0.0 if min_runtime is None else min_runtime,
        preemption_by=tuple(dict.fromkeys(by)),
        preemption_grace=_duration(raw.get("preemption_grace", "60s"), path, "shared.preemption_grace") or 0.0,
        default_cpus=None if cpus is None else float(cpus),
        default_ram=ram_bytes,
        default_pids=default_pids,
        max_pids=max_pids,
        idle_limit=idle_limit,
        default_time=default_time,
        max_time=max_time,
        idle_report=_duration(raw.get("idle_report", "2h"), path, "shared.idle_report"),
        reservation_idle=_duration(raw.get("reservation_idle", "1h"), path, "shared.reservation_idle"),
        reservation_quota=_hours(raw.get("reservation_quota", 24), path, "shared.reservation_quota"),
        outside_notify=_optional(raw.get("outside_notify"), str, path, "shared.outside_notify"),
        admins=_optional(raw.get("admins"), str, path, "shared.admins"),
        max_gpus_per_user=_count(raw.get("max_gpus_per_user"), path, "shared.max_gpus_per_user"),
        max_queued_per_user=_count(raw.get("max_queued_per_user", 10_000), path, "shared.max_queued_per_user"),
        fair_share_half_life=seconds,
        priority=dict(priority),
    )


def _cluster(name: str, raw: Any, path: Path | None) -> Cluster:
    key = f"clusters.{name}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [{key}] must be a table")
    _check_keys(raw, {"backend", "partition", "account", "time", "sbatch_flags"}, path, key + ".")
    backend = _typed(raw.get("backend", "slurm"), str, path, f"{key}.backend")
    if backend not in BACKENDS:
        raise ConfigError(f"{path}: {key}.backend = {backend!r}; gpuq knows {', '.join(BACKENDS)}")
    flags = raw.get("sbatch_flags", [])
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ConfigError(f'{path}: {key}.sbatch_flags must be a list of strings, e.g. ["--qos=normal"]')
    time = _optional(raw.get("time"), str, path, f"{key}.time")
    try:
        seconds = None if time is None else parse_duration(time)
    except BadInput as err:
        raise ConfigError(f"{path}: {key}.time: {err}") from None
    return Cluster(
        name=name,
        backend=backend,
        partition=_optional(raw.get("partition"), str, path, f"{key}.partition"),
        account=_optional(raw.get("account"), str, path, f"{key}.account"),
        time=seconds,
        sbatch_flags=tuple(flags),
    )


def _check_keys(raw: Mapping[str, Any], known: set[str], path: Path | None, prefix: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {prefix}{unknown[0]}; known keys here: {', '.join(prefix + k for k in sorted(known))}"
        )


def _typed(value: Any, kind: type, path: Path | None, key: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        raise ConfigError(f"{path}: {key} must be a {kind.__name__}, not {value!r}")
    return value


def _optional(value: Any, kind: type, path: Path | None, key: str) -> Any:
    return None if value is None else _typed(value, kind, path, key)


def _duration(value: Any, path: Path | None, key: str) -> float | None:
    """A duration setting ("24h"), or None for "off"."""
    text = _typed(value, str, path, key)
    if text == "off":
        return None
    try:
        seconds = parse_duration(text)
        check_update(None, seconds)  # a time limit's bounds
    except BadInput as err:
        raise ConfigError(f'{path}: {key}: {err} (or "off")') from None
    return seconds


def _hours(value: Any, path: Path | None, key: str) -> float | None:
    if value == "off":
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1e6:
        raise ConfigError(f'{path}: {key} is a number of GPU-hours, like 24 (or "off"), not {value!r}')
    return float(value)


def _count(value: Any, path: Path | None, key: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 31:
        raise ConfigError(f"{path}: {key} must be a whole number of 1 or more, not {value!r}")
    return value


def _pids(raw: Mapping[str, Any], key: str, default: int, path: Path | None) -> int | None:
    """A number of processes (``--pids``'s bounds), or None for "off"."""
    from gpuq_scheduler.jobs.options import MOST_PIDS, PIDS

    value = raw.get(key, default)
    if value == "off":
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadInput(f"{value!r} is not a whole number")
        return int(PIDS.kept(value))
    except BadInput:
        raise ConfigError(
            f'{path}: shared.{key} must be a number of processes from 16 to {MOST_PIDS}, like 4096 (or "off")'
        ) from None


def _watchdog(raw: Any, path: Path | None) -> Watchdog:
    from gpuq_scheduler.jobs.units import parse_size

    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: [watchdog] must be a table")
    _check_keys(raw, {"other_gpu", "past_share", "leftover", "tolerance"}, path, "watchdog.")
    actions = {}
    for rule in ("other_gpu", "past_share", "leftover"):
        value = raw.get(rule, "stop")
        if value not in WATCHDOG_ACTIONS:
            raise ConfigError(f'{path}: watchdog.{rule} must be "stop" or "warn", not {value!r}')
        actions[rule] = value
    tolerance = _optional(raw.get("tolerance"), str, path, "watchdog.tolerance")
    try:
        size = Watchdog.tolerance if tolerance is None else parse_size(tolerance)
    except BadInput as err:
        raise ConfigError(f"{path}: watchdog.tolerance: {err}") from None
    if not 0 <= size <= 1 << 40:
        raise ConfigError(f'{path}: watchdog.tolerance must be a size up to 1T, like "256M"')
    return Watchdog(tolerance=size, **actions)

"""A job's process limit as policy (#38, finding 5: a fork bomb in a job reached the whole machine): a shared
queue's default_pids and max_pids, a job's own --pids, which of them its cgroup gets where the pids controller
is there, and the reason a job held to it ends with. Plain values; the kernel's side is
tests/test_containment.py::test_a_fork_bomb_in_a_job_stops_at_its_process_limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.config import ConfigError, load
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobSpec
from gpuq_scheduler.jobs.options import PIDS
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.launcher.daemon.outcomes import contained
from gpuq_scheduler.launcher.policy.hostlimits import NONE, HostLimits, for_job, over_cap, unenforceable
from gpuq_scheduler.launcher.supervisor.exits import ExitFile

ALL = ("cpu", "memory", "pids")


def _spec(pids: int | None = None, **fields: object) -> JobSpec:
    kept = {} if pids is None else {"pids": pids}
    return JobSpec(command=("true",), cwd="/", options=kept, **fields)  # type: ignore[arg-type]


def test_a_shared_queue_limits_every_job_to_4096_processes_unless_its_admin_says_otherwise(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    env = {"GPUQ_SYSTEM_CONFIG": str(path), "GPUQ_CONFIG": str(tmp_path / "none.toml")}
    shared = load(env).shared
    assert (shared.default_pids, shared.max_pids) == (4096, 32768)  # no config at all
    path.write_text("[shared]\ndefault_pids = 1000\nmax_pids = 20000\n")
    assert (load(env).shared.default_pids, load(env).shared.max_pids) == (1000, 20000)
    path.write_text('[shared]\ndefault_pids = "off"\nmax_pids = "off"\n')
    assert (load(env).shared.default_pids, load(env).shared.max_pids) == (None, None)
    for bad, key in (
        ('default_pids = "many"', "default_pids"),
        ("default_pids = true", "default_pids"),
        ("default_pids = 3", "default_pids"),
        ("max_pids = 100000000", "max_pids"),
        ("default_pids = 5000\nmax_pids = 4000", "default_pids is more than shared.max_pids"),
    ):
        path.write_text(f"[shared]\n{bad}\n")
        with pytest.raises(ConfigError, match=rf"config\.toml: shared\.{key}"):
            load(env)


def test_pids_takes_a_number_of_processes_within_the_kernels_bounds() -> None:
    assert PIDS.kept(None) is None and PIDS.kept(8192) == 8192
    for bad in (0, 15, 4_194_305, True, "8192"):
        with pytest.raises(BadInput, match=r"--pids .*give the most processes the job may hold at once"):
            PIDS.kept(bad)
    assert _spec(8192).value(PIDS) == 8192 and _spec().value(PIDS) is None
    assert JobSpec.from_json(_spec(8192).to_json()).value(PIDS) == 8192  # kept in the spec's JSON, as stored


def test_a_jobs_own_pids_wins_over_the_queues_default_and_only_an_enforceable_limit_is_given() -> None:
    defaults = HostLimits(cpus=8.0, ram=64 << 30, pids=4096)
    assert for_job(_spec(), defaults, ALL) == defaults
    assert for_job(_spec(9000, cpus=2.0), defaults, ALL) == HostLimits(2.0, 64 << 30, 9000)
    assert for_job(_spec(9000), defaults, ("cpu", "memory")) == HostLimits(8.0, 64 << 30, None)  # no pids here
    assert for_job(_spec(), defaults, ()) == NONE  # the fallback, or an empty cgroup2: nothing breaks
    assert for_job(_spec(), NONE, ALL) == NONE  # a personal queue has no defaults
    assert for_job(_spec(100), NONE, ALL) == HostLimits(pids=100)


def test_a_pids_past_the_queues_maximum_is_refused_and_an_own_pids_no_longer_enforceable_says_why() -> None:
    assert over_cap(_spec(40000), 32768) == "--pids 40000 is more than this queue allows (max_pids 32768)"
    assert over_cap(_spec(32768), 32768) == "" and over_cap(_spec(), 32768) == "" and over_cap(_spec(10**6), None) == ""
    why = "/sys/fs/cgroup has no cpu, memory or pids controller to give"
    assert unenforceable(_spec(), ("cpu",), why) == ""  # a default is left out, never a reason to fail
    assert unenforceable(_spec(9000), ("cpu", "memory"), why) == (
        f"--pids cannot be enforced here any more ({why}); submit it again without it"
    )


def _ended(outcome: Outcome, **facts: object) -> Outcome:
    exit_file = ExitFile(job=1, ended_at=0.0, started=True, exit_code=outcome.exit_code, contained=dict(facts))
    return contained(outcome, exit_file)


def test_a_job_that_failed_after_forks_were_refused_at_its_limit_says_it_reached_its_limit() -> None:
    failed = Outcome.failed(1, "BlockingIOError: [Errno 11] Resource temporarily unavailable")
    held = _ended(failed, pids_limit=4096, pids_refused=3, outlived=4095)
    assert held.state is JobState.FAILED and held.cause is Cause.PROCESS_LIMIT and held.exit_code == 1
    assert held.recorded_reason() == (
        "reached its limit of 4096 processes; BlockingIOError: [Errno 11] Resource temporarily unavailable "
        "(exit code 1); 4095 processes outlived the job and were ended"
    )
    killed = _ended(Outcome.killed(9), pids_limit=64, pids_refused=1)
    assert killed.cause is Cause.PROCESS_LIMIT
    assert killed.reason == "reached its limit of 64 processes; killed by SIGKILL"
    succeeded = _ended(Outcome.succeeded(), pids_limit=64, pids_refused=1)
    assert succeeded.state is JobState.SUCCEEDED and succeeded.reason == "it reached its limit of 64 processes"
    timeout = _ended(Outcome.timeout(60.0, 15), pids_limit=64, pids_refused=2)
    assert timeout.cause is Cause.TIME_LIMIT
    assert timeout.reason == "time limit of 60s reached; it reached its limit of 64 processes"
    assert _ended(failed, pids_limit=4096) == failed  # held to a limit it never reached: nothing to say
    oom = _ended(Outcome.killed(9), ram_limit=1 << 30, oom_kills=1, pids_limit=64, pids_refused=1)
    assert oom.cause is Cause.HOST_OOM  # the OOM killer ended it: that is the reason, not a refused fork

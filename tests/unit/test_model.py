from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.model import JobRecord, JobSpec, Mode
from gpuq_scheduler.jobs.outcome import JobState, Outcome

specs = st.builds(
    JobSpec,
    command=st.lists(st.text(min_size=1), min_size=1, max_size=4).map(tuple),
    cwd=st.text(min_size=1),
    env=st.dictionaries(st.text(), st.text(), max_size=4),
    gpus=st.integers(1, 8),
    mem_per_gpu=st.none() | st.integers(1, 1 << 40),
    name=st.text(max_size=20),
    priority=st.integers(-100, 100),
    time_limit=st.none() | st.floats(1, 1e6),
    mode=st.sampled_from([Mode.SINGLE, Mode.DATAPARALLEL]),
    python=st.none() | st.text(min_size=1),
)


@given(specs)
def test_spec_round_trips_through_json(spec: JobSpec) -> None:
    assert JobSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_spec_is_frozen_and_keeps_secrets_out_of_its_repr() -> None:
    spec = JobSpec(command=("train.py",), cwd="/w", env={"WANDB_API_KEY": "s3cret"})
    assert "s3cret" not in repr(spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.gpus = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    "data",
    [
        {"cwd": "/w"},
        {"command": "ls", "cwd": "/w"},
        {"command": ["ls"], "cwd": 5},
        {"command": ["ls"], "cwd": "/", "gpus": "2"},
        {"command": ["ls"], "cwd": "/", "gpus": True},
        {"command": ["ls"], "cwd": "/", "mode": "x"},
        {"command": [], "cwd": "/"},
        {"command": ["ls"], "cwd": "/", "env": {"A": 1}},
    ],
)
def test_spec_from_bad_json_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(BadInput):
        JobSpec.from_json(data)


def test_outcomes_carry_their_facts() -> None:
    assert Outcome.succeeded() == Outcome(JobState.SUCCEEDED, Cause.SUCCEEDED, exit_code=0)
    assert Outcome.failed(3).reason == "exit code 3"
    assert Outcome.killed(9).reason == "killed by SIGKILL"
    assert Outcome.timeout(60, 15).state is JobState.TIMEOUT
    assert Outcome.cancelled("alice").reason == "cancelled by alice"
    assert Outcome.failed_to_spawn("x: No such file").reason == "could not start: x: No such file"
    assert JobState.LOST.finished and not JobState.RUNNING.finished


def test_the_records_a_daemon_holds_by_the_ten_thousand_stay_compact() -> None:
    """Past 30 fields CPython stops sharing a class's keys among its instances: each then carries a dict of its
    own, 1.3 KB more and slower to read (10,000 pending records cost the daemon's pass a sixth more). So a
    record has slots, and a spec, read as often, stays within the limit (or takes slots too)."""
    record = JobRecord(
        id=1, spec=JobSpec(command=("true",), cwd="/"), uid=0, user="u", state=JobState.PENDING, submitted_at=0.0
    )
    assert not hasattr(record, "__dict__")
    assert record.replace(attempt=2).attempt == 2 and pickle.loads(pickle.dumps(record)) == record
    assert len(dataclasses.fields(JobSpec)) <= 30 or not hasattr(record.spec, "__dict__")


def test_the_public_view_says_a_jobs_host_limits_and_whether_it_may_be_preempted() -> None:
    """`gpuq show --json` left out --cpus, --ram and --preemptible, which `gpuq show` and the queue act on."""
    spec = JobSpec(command=("x",), cwd="/", cpus=2.5, ram=8 << 30, preemptible=True)
    shown = JobRecord(1, spec, 0, "a", JobState.RUNNING, 0.0).to_json()
    assert (shown["cpus"], shown["ram"], shown["preemptible"]) == (2.5, 8 << 30, True)
    plain = JobRecord(2, JobSpec(command=("x",), cwd="/"), 0, "a", JobState.PENDING, 0.0).to_json()
    assert (plain["cpus"], plain["ram"], plain["preemptible"]) == (None, None, False)

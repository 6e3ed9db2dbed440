"""The preemption policy (launcher/policy/preemption.py): plain values, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq_scheduler.launcher.policy.placement import GpuView, Holding, Policy
from gpuq_scheduler.launcher.policy.preemption import Choice, Job, Settings, choose, why_preemptible

GiB = 1 << 30
ON = Settings(enabled=True, min_runtime=60.0)
NOW = 1000.0


def _gpus(count: int = 2, total: int = 80 * GiB) -> list[GpuView]:
    return [GpuView(i, total) for i in range(count)]


def _sweep(job_id: int, gpu: int, **more: object) -> Job:
    """A --preemptible whole-GPU job that ran 10 minutes on ``gpu`` holding 40 GiB."""
    fields: dict[str, object] = {"preemptible": True, "ran": 600.0, "held": 40 * GiB, "mem_per_gpu": None}
    fields.update(more)
    return Job(job_id, (gpu,), **fields)  # type: ignore[arg-type]


def test_an_urgent_job_takes_the_gpu_of_a_preemptible_job() -> None:
    urgent = Job(9, 1, None, priority=10)
    choice = choose(urgent, _gpus(), [], [_sweep(1, 0), _sweep(2, 1)], NOW, ON)
    assert choice == Choice(9, (1,), (0,), {1: "priority 10 > 0"})


def test_preemption_is_off_by_default() -> None:
    assert choose(Job(9, 1, None, priority=10), _gpus(), [], [_sweep(1, 0), _sweep(2, 1)], NOW, Settings()) is None


def test_a_job_that_is_not_preemptible_is_never_chosen() -> None:
    running = [_sweep(1, 0, preemptible=False), _sweep(2, 1, preemptible=False)]
    assert choose(Job(9, 1, None, priority=10), _gpus(), [], running, NOW, ON) is None
    # ...unless the admin makes lower priority preemptible by policy
    by_priority = Settings(enabled=True, min_runtime=60.0, by_priority=True)
    assert choose(Job(9, 1, None, priority=10), _gpus(), [], running, NOW, by_priority) is not None


def test_a_job_below_its_minimum_runtime_is_not_preempted() -> None:
    running = [_sweep(1, 0, ran=59.0), _sweep(2, 1, ran=30.0)]
    assert choose(Job(9, 1, None, priority=10), _gpus(), [], running, NOW, ON) is None


def test_a_preemptible_job_does_not_preempt_its_equals() -> None:
    """Two --preemptible jobs of one priority: neither takes the other's GPU (no thrash between sweeps)."""
    waiting = Job(9, 1, None, preemptible=True)
    assert choose(waiting, _gpus(), [], [_sweep(1, 0), _sweep(2, 1)], NOW, ON) is None
    assert why_preemptible(Job(9, 1, None), _sweep(1, 0), ON) == "job 1 is --preemptible"


def test_the_cheapest_victims_go_first_bytes_then_times_already_preempted() -> None:
    urgent = Job(9, 1, None, priority=10)
    small = choose(urgent, _gpus(), [], [_sweep(1, 0, held=30 * GiB), _sweep(2, 1, held=10 * GiB)], NOW, ON)
    assert small is not None and small.victims == (2,)
    again = [_sweep(1, 0, held=30 * GiB), _sweep(2, 1, held=10 * GiB, preemptions=1)]
    choice = choose(urgent, _gpus(), [], again, NOW, ON)
    assert choice is not None and choice.victims == (1,)


def test_a_mem_job_takes_only_as_many_packed_victims_as_it_needs() -> None:
    packed = [
        Job(1, (0,), 20 * GiB, preemptible=True, ran=600, held=20 * GiB),
        Job(2, (0,), 20 * GiB, preemptible=True, ran=600, held=5 * GiB),
        Job(3, (0,), 30 * GiB, preemptible=True, ran=600, held=30 * GiB),
    ]
    choice = choose(Job(9, 1, 20 * GiB), _gpus(1), [], packed, NOW, ON)
    assert choice is not None and choice.victims == (2,)  # 80 - 3 overheads - 50 leaves 25 - margin: enough


def test_a_packed_victim_suspended_in_place_is_taken_before_one_that_would_be_requeued() -> None:
    """#40: a --preemptible packed job (an MPS client its fast path empties) is suspended in place and goes on
    where it was; a neighbour that cannot be suspended would lose its process to a requeue. The first is taken
    though it holds more, the second only where the first alone leaves too little room."""
    in_place = Job(1, (0,), 30 * GiB, preemptible=True, ran=600, held=30 * GiB)
    requeued = Job(2, (0,), 30 * GiB, preemptible=True, ran=600, held=2 * GiB, requeue=True)
    choice = choose(Job(9, 1, 20 * GiB, priority=10), _gpus(1), [], [in_place, requeued], NOW, ON)
    assert choice is not None and choice.victims == (1,)
    both = choose(Job(9, 1, 60 * GiB, priority=10), _gpus(1), [], [in_place, requeued], NOW, ON)
    assert both is not None and both.victims == (1, 2)


def test_a_running_job_whose_time_limit_ends_first_frees_the_gpu_sooner() -> None:
    """The GPU's job ends in 5 s; suspending the other's 40 GiB would take about 43 s: wait instead."""
    urgent = Job(9, 1, None, priority=10)
    running = [_sweep(1, 0, ends_by=NOW + 5), _sweep(2, 1)]
    assert choose(urgent, _gpus(), [], running, NOW, ON) is None
    later = [_sweep(1, 0, ends_by=NOW + 3600), _sweep(2, 1)]
    assert choose(urgent, _gpus(), [], later, NOW, ON) is not None


def test_a_place_kept_for_a_suspended_victim_is_never_taken() -> None:
    kept = [Holding(5, (0,), None)]  # job 5, preempted earlier, resumes on GPU 0
    choice = choose(Job(9, 1, None, priority=10), _gpus(), kept, [_sweep(1, 0), _sweep(2, 1)], NOW, ON)
    assert choice is not None and choice.gpus == (1,) and choice.victims == (2,)


def test_a_job_that_fits_now_takes_nothing() -> None:
    assert choose(Job(9, 1, None, priority=10), _gpus(3), [], [_sweep(1, 0), _sweep(2, 1)], NOW, ON) is None


def test_fair_share_makes_an_over_share_users_jobs_preemptible_for_others() -> None:
    fair = Settings(enabled=True, min_runtime=60.0, by_fair_share=True)
    hog = _sweep(1, 0, preemptible=False, user="bob", over_share=True)
    waiting = Job(9, 1, None, user="alice")
    assert why_preemptible(waiting, hog, fair) == "bob is over their fair share"
    assert why_preemptible(waiting, hog, ON) == ""
    assert why_preemptible(Job(9, 1, None, user="bob"), hog, fair) == ""  # not for bob's own jobs


def test_between_users_the_users_priorities_count_not_the_jobs() -> None:
    sweep = _sweep(1, 0, user="bob", priority=100, user_priority=0)
    assert why_preemptible(Job(9, 1, None, user="alice", user_priority=5), sweep, ON) == "alice's priority 5 > 0"


_JOBS = st.lists(
    st.tuples(
        st.integers(0, 3),  # its GPU
        st.one_of(st.none(), st.integers(1, 60)),  # --mem in GiB, or a whole GPU
        st.booleans(),  # --preemptible
        st.floats(0, 1200),  # ran
        st.integers(0, 3),  # times preempted
        st.integers(0, 70),  # GiB held
        st.integers(-2, 2),  # priority
    ),
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(_JOBS, st.integers(1, 3), st.one_of(st.none(), st.integers(1, 70)), st.integers(-2, 3), st.booleans())
def test_victims_are_only_eligible_jobs_and_the_chosen_gpus_then_fit_without_double_booking(
    raw: list[tuple[int, int | None, bool, float, int, int, int]],
    count: int,
    mem: int | None,
    priority: int,
    preemptible: bool,
) -> None:
    policy = Policy()
    gpus = _gpus(4)
    running: list[Job] = []
    used: dict[int, int] = {}
    for job_id, (gpu, gib, flag, ran, times, held, prio) in enumerate(raw, 1):
        size = 80 * GiB if gib is None else gib * GiB + policy.overhead
        if used.get(gpu, 0) + size > 80 * GiB - policy.margin or (gib is None and used.get(gpu)):
            continue  # placement would not have put it there
        used[gpu] = used.get(gpu, 0) + (80 * GiB if gib is None else size)
        mem_gib = None if gib is None else gib * GiB
        running.append(
            Job(job_id, (gpu,), mem_gib, preemptible=flag, ran=ran, preemptions=times, held=held * GiB, priority=prio)
        )
    waiting = Job(99, count, None if mem is None else mem * GiB, priority=priority, preemptible=preemptible)
    choice = choose(waiting, gpus, [], running, NOW, ON, policy)
    if choice is None:
        return
    by_id = {job.job_id: job for job in running}
    assert len(choice.gpus) == count == len(set(choice.gpus))
    for victim in choice.victims:
        assert why_preemptible(waiting, by_id[victim], ON), "a victim that may not be preempted"
        assert by_id[victim].ran >= ON.min_runtime
    for gpu in choice.gpus:  # once the victims are off, the waiting job fits each of its GPUs: none double-booked
        left = [job for job in running if gpu in job.gpus and job.job_id not in choice.victims]  # type: ignore[operator]
        if mem is None:
            assert not left
        else:
            taken = sum(80 * GiB if j.mem_per_gpu is None else j.mem_per_gpu + policy.overhead for j in left)
            assert 80 * GiB - policy.margin - taken >= mem * GiB + policy.overhead
    # every victim sits on a chosen GPU: nothing is taken for nothing
    assert all(set(by_id[v].gpus) & set(choice.gpus) for v in choice.victims)  # type: ignore[arg-type]


def test_a_shared_queue_reads_its_preemption_settings_from_the_config(tmp_path: Path) -> None:
    from gpuq_scheduler.jobs.config import ConfigError, load
    from gpuq_scheduler.launcher.daemon.preempting import settings as daemon_settings

    path = tmp_path / "config.toml"
    env = {"GPUQ_SYSTEM_CONFIG": str(path), "GPUQ_CONFIG": str(tmp_path / "none.toml")}
    assert daemon_settings(load(env).shared, {}) == Settings()  # off unless the admin sets it
    path.write_text('[shared]\npreemption = true\npreemption_min_runtime = "30m"\npreemption_by = ["priority"]\n')
    assert daemon_settings(load(env).shared, {}) == Settings(enabled=True, min_runtime=1800.0, by_priority=True)
    for bad in ('preemption = "yes"', 'preemption_by = ["seniority"]', 'preemption_min_runtime = "soon"'):
        path.write_text(f"[shared]\n{bad}\n")
        with pytest.raises(ConfigError, match=r"shared\.preemption"):
            load(env)


def test_a_personal_queue_reads_gpuq_preempt_and_refuses_a_bad_value() -> None:
    from gpuq_scheduler.jobs.errors import BadInput
    from gpuq_scheduler.launcher.daemon.preempting import settings as daemon_settings

    assert daemon_settings(None, {}) == Settings()
    on = {"GPUQ_PREEMPT": "on", "GPUQ_PREEMPT_MIN_RUNTIME": "90s", "GPUQ_PREEMPT_BY": "fair_share"}
    assert daemon_settings(None, on) == Settings(enabled=True, min_runtime=90.0, by_fair_share=True)
    with pytest.raises(BadInput, match="GPUQ_PREEMPT="):
        daemon_settings(None, {"GPUQ_PREEMPT": "yes"})


def test_a_preempted_job_is_queued_again_at_once_a_victim_of_anothers_memory_after_the_backoff() -> None:
    """A requeued preemption victim keeps its place in queue order at once (tests/test_preemption.py shows it
    starting before a job submitted after it); one whose memory another job took waits for the culprit."""
    from gpuq_scheduler.jobs.causes import Cause
    from gpuq_scheduler.launcher.policy.lifecycle import requeue_delay

    assert requeue_delay(Cause.PREEMPTED, 10.0) == 0.0
    assert requeue_delay(Cause.OOM_VICTIM, 10.0) == 10.0

"""launcher.policy.memory: learned reservations for --mem auto, with plain values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuq_scheduler.jobs.causes import Cause, OutOfMemory
from gpuq_scheduler.jobs.model import JobRecord, JobSpec
from gpuq_scheduler.jobs.outcome import JobState, Outcome
from gpuq_scheduler.launcher.policy import lifecycle, memory
from gpuq_scheduler.launcher.policy.memory import Estimate, Peak, Wait

GiB = 1 << 30
MiB = 1 << 20


def test_keys_go_from_the_most_specific_to_the_command_line() -> None:
    keys = memory.kinds(like=17, array_id=40, name="resnet", kind="ab12")
    assert keys == ["job:17", "array:40", "name:resnet", "cmd:ab12"]
    assert memory.kinds(like=None, array_id=None, name="", kind="ab12") == ["cmd:ab12"]


def test_a_known_peak_gives_the_peak_plus_a_margin_and_says_where_it_came_from() -> None:
    peaks = {"cmd:ab12": Peak(5 * GiB, job_id=17)}
    found = memory.estimate(30, ["array:40", "cmd:ab12"], peaks, {}, overhead=0)
    assert isinstance(found, Estimate)
    assert found.mem == 6 * GiB  # 5 GiB + 20 %
    assert found.note == "6.0G learned from job 17: peak 5.0G"


def test_the_array_s_own_peak_wins_over_the_command_line_s() -> None:
    peaks = {"array:40": Peak(2 * GiB, 31), "cmd:ab12": Peak(9 * GiB, 17)}
    found = memory.estimate(32, ["array:40", "cmd:ab12"], peaks, {}, overhead=0)
    assert isinstance(found, Estimate) and "job 31" in found.note


def test_the_overhead_placement_adds_is_taken_out_of_the_share_not_added_twice() -> None:
    found = memory.estimate(30, ["cmd:x"], {"cmd:x": Peak(5 * GiB, 17)}, {}, overhead=1 * GiB)
    assert isinstance(found, Estimate)
    assert found.mem == 5 * GiB  # 6 GiB in all, 1 GiB of it the overhead placement counts on top
    assert found.note.startswith("6.0G learned from job 17")


def test_with_no_history_the_first_job_probes_on_a_whole_gpu_and_the_rest_wait_for_it() -> None:
    first = memory.estimate(30, ["array:40", "cmd:ab12"], {}, {})
    assert first == Estimate(None, "a probe on a whole GPU: no earlier run of its kind", probe=True)
    waiting = memory.estimate(31, ["array:40", "cmd:ab12"], {}, {"array:40": 30, "cmd:ab12": 30})
    assert isinstance(waiting, Wait) and "job 30" in waiting.reason
    again = memory.estimate(30, ["array:40", "cmd:ab12"], {}, {"array:40": 30})
    assert isinstance(again, Estimate)  # the probe itself never waits for itself


def test_a_configured_probe_size_replaces_the_whole_gpu() -> None:
    found = memory.estimate(30, ["cmd:x"], {}, {}, probe_mem=8 * GiB)
    assert found == Estimate(8 * GiB, "a probe on 8.0G (auto.probe_mem): no earlier run of its kind", probe=True)


def test_a_reservation_as_big_as_a_gpu_is_a_whole_gpu() -> None:
    found = memory.estimate(30, ["cmd:x"], {"cmd:x": Peak(75 * GiB, 17)}, {}, biggest_gpu=80 * GiB)
    assert isinstance(found, Estimate) and found.mem is None and found.note.startswith("whole GPU")


def test_after_an_out_of_memory_the_raised_share_is_used_as_it_is() -> None:
    found = memory.estimate(30, ["cmd:x"], {"cmd:x": Peak(12 * GiB, 17, raised=True)}, {}, overhead=0)
    assert isinstance(found, Estimate) and found.mem == 12 * GiB
    assert found.note == "12.0G learned: twice its share after job 17 ran out of memory"


def test_a_settled_probe_is_shown_as_running() -> None:
    found = memory.estimate(30, ["cmd:x"], {"cmd:x": Peak(1 * GiB, 17, running=True)}, {}, overhead=0)
    assert isinstance(found, Estimate) and "job 17 (running)" in found.note


def test_learning_keeps_the_worst_run_and_replaces_provisional_figures() -> None:
    keys = ["array:40", "cmd:x"]
    learned = memory.learn({}, keys, Peak(4 * GiB, 30, running=True))
    assert set(learned) == set(keys)
    learned = {**learned, **memory.learn(learned, keys, Peak(3 * GiB, 30))}  # the probe ended lower: it counts
    assert learned["cmd:x"] == Peak(3 * GiB, 30)
    assert memory.learn(learned, keys, Peak(2 * GiB, 31)) == {}  # a smaller run does not shrink the share
    assert memory.learn(learned, keys, Peak(5 * GiB, 31, running=True)) == {}  # nor a probe override a run
    grown = memory.learn(learned, keys, Peak(8 * GiB, 32, raised=True))
    assert grown["cmd:x"].raised
    assert memory.learn({**learned, **grown}, keys, Peak(7 * GiB, 33))["cmd:x"] == Peak(7 * GiB, 33)


@given(st.integers(min_value=1, max_value=200 * GiB), st.floats(min_value=0, max_value=2))
def test_a_reservation_always_covers_the_peak_with_at_least_the_floor_to_spare(peak: int, margin: float) -> None:
    reserved = memory.reservation(peak, margin)
    assert reserved >= peak + memory.FLOOR
    assert reserved % MiB == 0


def test_a_probe_whose_peak_held_still_counts_before_the_settle_time() -> None:
    """Issue 40: the first run of a kind waited the whole settle time (20 s) for its probe's peak."""
    assert memory.counts(5.0, 4.0, settle=20.0, steady=4.0)  # three samples 2 s apart showed the same peak
    assert not memory.counts(5.0, 2.0, settle=20.0, steady=4.0)  # it grew at the last sample but one
    assert memory.counts(20.0, 0.0, settle=20.0, steady=4.0)  # still growing at the settle time: counts all the same


def test_a_probe_with_no_memory_seen_never_counts_and_steady_off_waits_the_settle_time() -> None:
    assert not memory.counts(60.0, None, settle=20.0, steady=4.0)  # nothing to teach yet
    assert not memory.counts(19.9, 19.0, settle=20.0, steady=None)
    assert memory.counts(20.0, 19.0, settle=20.0, steady=None)


@given(st.floats(0, 100), st.floats(0, 100), st.floats(0, 100), st.floats(0, 100) | st.none(), st.floats(0, 100))
def test_once_a_probe_counts_it_keeps_counting_and_none_waits_past_the_settle_time(
    ran: float, still: float, settle: float, steady: float | None, later: float
) -> None:
    still = min(still, ran)  # its peak cannot have held still longer than the probe has run
    if memory.counts(ran, still, settle=settle, steady=steady):
        assert memory.counts(ran + later, still + later, settle=settle, steady=steady)  # no growth since
    assert memory.counts(max(ran, settle), still, settle=settle, steady=steady)


def test_an_auto_job_stopped_at_its_fence_retries_until_its_share_holds_not_once() -> None:
    """A probe's early peak can be its CUDA context alone: a member fenced at it must come back until its share
    holds (it once had one retry, so a second fence meant a failed job that the 20 s probe would have run)."""
    spec = JobSpec(command=("x",), cwd="/", mem_per_gpu=256 * MiB, mem_auto=True)
    outcome = Outcome.out_of_memory(OutOfMemory(Cause.OOM_PAST_SHARE, share=256 * MiB, asked="auto"), 1, None)
    shares, attempt = [], 1
    while (
        retry := lifecycle.retry(
            JobRecord(1, spec, 0, "a", JobState.RUNNING, 0.0, attempt=attempt), outcome, backoff=1, biggest_gpu=80 * GiB
        )
    ) is not None:
        if retry.spec.mem_per_gpu is None:
            break  # a whole GPU: past there, an out-of-memory is the job's own
        assert retry.delay == 0.0  # gpuq's guess was short: it comes back at once, no backoff per doubling
        spec, attempt = retry.spec, attempt + 1
        shares.append(spec.mem_per_gpu)
    assert retry is not None and retry.spec.mem_per_gpu is None  # it got there, one doubling at a time
    assert shares == [256 * MiB << k for k in range(1, 9)]  # 512M ... 64G, then the whole 80G GPU
    whole = JobSpec(command=("x",), cwd="/", mem_per_gpu=None, mem_auto=True)
    plain = Outcome.out_of_memory(OutOfMemory(Cause.OOM), 1, None)
    assert (
        lifecycle.retry(
            JobRecord(1, whole, 0, "a", JobState.RUNNING, 0.0, attempt=10), plain, backoff=1, biggest_gpu=80 * GiB
        )
        is None
    )
    # --oom-retry of a --mem the user gave still retries once, after its backoff: their figure, not gpuq's guess.
    first = JobSpec(command=("x",), cwd="/", mem_per_gpu=4 * GiB, oom_retry=True)
    again = lifecycle.retry(
        JobRecord(1, first, 0, "a", JobState.RUNNING, 0.0, attempt=1), outcome, backoff=10, biggest_gpu=80 * GiB
    )
    assert again is not None and again.delay == 10 and again.spec.mem_per_gpu == 8 * GiB
    given_mem = JobSpec(command=("x",), cwd="/", mem_per_gpu=4 * GiB, oom_retry=True)
    assert (
        lifecycle.retry(
            JobRecord(1, given_mem, 0, "a", JobState.RUNNING, 0.0, attempt=2), outcome, backoff=1, biggest_gpu=80 * GiB
        )
        is None
    )


def test_with_no_history_and_a_fence_every_job_starts_at_once_on_a_first_share() -> None:
    """Issue 40: no job of a first run waits for a probe; each is fenced at a sixteenth of its GPU."""
    share = memory.first_share(143 * GiB - 512 * MiB, overhead=1 * GiB)  # an H200, less placement's margin
    assert share == (143 * GiB - 512 * MiB) // 16 - 1 * GiB >> 20 << 20  # 16 of them fit, with their contexts
    for job_id in (30, 31):  # no probe filed, none waits
        found = memory.estimate(job_id, ["array:40", "cmd:x"], {}, {}, overhead=1 * GiB, first=share)
        assert found == Estimate(share, "a first run on 7.9G, fenced: no earlier run of its kind")
    learned = memory.estimate(32, ["cmd:x"], {"cmd:x": Peak(1 * GiB, 30)}, {}, overhead=1 * GiB, first=share)
    assert isinstance(learned, Estimate) and learned.note.startswith("1.2G learned from job 30")  # history wins
    assert memory.first_share(8 * GiB, overhead=1 * GiB) == memory.FLOOR  # a small GPU: the floor

"""When the fast path's pool is kept and which pools a suspend takes back (#40): the pure rules of
``launcher.policy.hostroom``, and GPUQ_FAST_POOL's values (``launcher.daemon.suspension.pools.mode``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq_scheduler.jobs.errors import DaemonError
from gpuq_scheduler.launcher.daemon.suspension.pools import mode
from gpuq_scheduler.launcher.policy.hostroom import give_back, keeps

GiB = 1 << 30


@pytest.mark.parametrize(
    ("available", "others", "kept"),
    [
        (18 * GiB, 0, True),  # the lent H200: 125 GiB, a 100 GiB pool, no other preemptible job
        (5 * GiB, 0, False),  # below the margin: the host is near swap
        (40 * GiB, 30 * GiB, True),  # another job's 30 GiB suspend still fits beside it
        (40 * GiB, 36 * GiB, False),  # it would not: the pool goes, so that suspend never waits on it
    ],
)
def test_a_pool_is_kept_only_while_the_host_keeps_the_margin_and_the_other_jobs_suspends(
    available: int, others: int, kept: bool
) -> None:
    assert keeps(available, 6 * GiB, others) is kept


def test_a_suspend_takes_back_the_fewest_pools_largest_first_and_none_where_it_fits_or_nothing_would() -> None:
    pools = {3: 10 * GiB, 5: 60 * GiB, 7: 30 * GiB}
    assert give_back(20 * GiB, 40 * GiB, 5 * GiB, pools) == []  # fits as it is
    assert give_back(40 * GiB, 40 * GiB, 5 * GiB, pools) == [5]
    assert give_back(120 * GiB, 40 * GiB, 5 * GiB, pools) == [5, 7]
    assert give_back(200 * GiB, 40 * GiB, 5 * GiB, pools) is None  # all of them would not make the room
    assert give_back(40 * GiB, 40 * GiB, 5 * GiB, {}) is None


@given(
    need=st.integers(0, 1 << 40),
    available=st.integers(0, 1 << 40),
    pools=st.dictionaries(st.integers(1, 50), st.integers(0, 1 << 38), max_size=8),
)
def test_the_pools_taken_back_make_the_room_and_none_is_taken_for_nothing(
    need: int, available: int, pools: dict[int, int]
) -> None:
    spare = 2 * GiB
    chosen = give_back(need, available, spare, pools)
    if chosen is None:
        assert need + spare > available + sum(pools.values())
        return
    assert len(set(chosen)) == len(chosen) and all(pools[job] > 0 for job in chosen)
    assert need + spare <= available + sum(pools[job] for job in chosen)
    if chosen:  # without its smallest, it would not fit
        assert need + spare > available + sum(pools[job] for job in chosen) - min(pools[job] for job in chosen)


def test_gpuq_fast_pool_is_auto_on_or_off_and_anything_else_is_refused_in_one_line() -> None:
    assert mode({}) == "auto" and mode({"GPUQ_FAST_POOL": ""}) == "auto"
    assert [mode({"GPUQ_FAST_POOL": v}) for v in ("auto", "on", "off")] == ["auto", "on", "off"]
    with pytest.raises(DaemonError, match=r"^GPUQ_FAST_POOL='yes': set it to auto \(the default\), on or off$"):
        mode({"GPUQ_FAST_POOL": "yes"})

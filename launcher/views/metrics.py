"""Prometheus metrics for `gpuq serve`'s ``/metrics``, computed from the queue and the GPUs at each scrape
(prometheus-client's custom collector: nothing is kept between scrapes, so a restart loses nothing).

    gpuq_jobs{state,user}                      gauge: jobs pending or running now
    gpuq_jobs_started_total                    counter: jobs that have started, ever (from the job table)
    gpuq_jobs_ended_total{outcome}             counter: jobs that ended, by outcome (succeeded, failed, ...)
    gpuq_queue_wait_seconds                    histogram: submit -> start of every job that started
    gpuq_gpu_hours_total{user}                 counter: GPUs held times hours, by the jobs of each user (so far)
    gpuq_gpu_energy_joules_total{user}         counter: GPU energy charged to each user's jobs (docs/watchdog.md)
    gpuq_cpu_seconds_total{user}               counter: host CPU time of each user's jobs, ended and so far
                                               (their cgroups: docs/containment.md; absent under the fallback)
    gpuq_job_peak_ram_bytes{user}              histogram: the peak host memory of each ended job whose cgroup
                                               measured it (the memory controller); _sum adds the peaks up
    gpuq_preemptions_total{user}               counter: times each user's jobs were preempted (docs/suspend.md)
    gpuq_suspends_total{user}                  counter: suspends of each user's jobs to host memory
    gpuq_suspend_bytes_total{user}             counter: GPU state those suspends moved to host memory
    gpuq_suspended_seconds_total{user}         counter: time each user's jobs spent suspended (so far)
                                               (the four from events.jsonl and the table: absent until a suspend)
    gpuq_gpu_memory_total_bytes{gpu,uuid}      gauge: each GPU's memory
    gpuq_gpu_memory_bytes{gpu,uuid,holder}     gauge: holder = jobs (what gpuq's jobs use now), reserved (reserved
                                               for them, not used), outside (processes outside gpuq), free
    gpuq_gpu_utilization_ratio{gpu,uuid}       gauge: 0-1, NVML's utilisation (absent where unknown)
    gpuq_gpu_up{gpu,uuid}                      gauge: 1, or 0 once the GPU is lost

The counters are monotonic because the job table only grows; like the dashboard they name no command.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.outcome import JobState
from gpuq_scheduler.launcher.views.live import Picture
from gpuq_scheduler.launcher.views.suspend_costs import Moves
from gpuq_scheduler.launcher.views.suspend_costs import by_user as by_user_moves

WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0)
RAM_BUCKETS = tuple(float(1 << shift) for shift in range(26, 42, 2))  # 64 MiB, 256 MiB, ... 1 TiB: --ram's sizes


class QueueCollector(Collector):
    """Reads ``picture()`` (the GPUs and active jobs) and ``records()`` (every job) at each scrape."""

    def __init__(
        self,
        picture: Callable[[], Picture],
        records: Callable[[], list[JobRecord]],
        moves: Callable[[], dict[int, Moves]] | None = None,
    ) -> None:
        self.picture, self.records, self.moves = picture, records, moves

    def collect(self) -> Iterator[Metric]:
        picture = self.picture()
        records = self.records()
        active = GaugeMetricFamily("gpuq_jobs", "Jobs pending or running now", labels=["state", "user"])
        waiting_or_running = Counter((r.state.value, r.user) for r in records if not r.state.finished)
        for (state, user), count in sorted(waiting_or_running.items()):
            active.add_metric([state, user], count)
        yield active
        started = [r for r in records if r.started_at is not None]
        yield CounterMetricFamily("gpuq_jobs_started", "Jobs that have started", value=len(started))
        ended = CounterMetricFamily("gpuq_jobs_ended", "Jobs that ended, by outcome", labels=["outcome"])
        counts = Counter(r.state.value for r in records if r.state.finished)
        for state in JobState:
            if state.finished:
                ended.add_metric([state.value], counts.get(state.value, 0))
        yield ended
        waits = sorted(max(0.0, (r.started_at or 0.0) - r.submitted_at) for r in started)
        buckets = [(_le(b), sum(1 for w in waits if w <= b)) for b in WAIT_BUCKETS] + [("+Inf", len(waits))]
        yield HistogramMetricFamily(
            "gpuq_queue_wait_seconds",
            "Time from submit to start of the jobs that started",
            buckets=buckets,
            sum_value=sum(waits),
        )
        hours = CounterMetricFamily("gpuq_gpu_hours", "GPUs held times hours, by user", labels=["user"])
        joules = CounterMetricFamily("gpuq_gpu_energy_joules", "GPU energy charged to jobs, by user", labels=["user"])
        by_user: dict[str, list[float]] = {}
        for r in started:
            spent = by_user.setdefault(r.user, [0.0, 0.0])
            spent[0] += r.gpu_hours(picture.taken) or 0.0
            spent[1] += r.energy or 0.0
        for user, (held, used) in sorted(by_user.items()):
            hours.add_metric([user], held)
            joules.add_metric([user], used)
        yield from (hours, joules)
        yield from _host_use(records, picture.running)
        if self.moves is not None:
            yield from _suspensions(by_user_moves(records, self.moves(), picture.taken))
        total = GaugeMetricFamily("gpuq_gpu_memory_total_bytes", "GPU memory", labels=["gpu", "uuid"])
        memory = GaugeMetricFamily("gpuq_gpu_memory_bytes", "GPU memory by holder", labels=["gpu", "uuid", "holder"])
        util = GaugeMetricFamily("gpuq_gpu_utilization_ratio", "GPU utilisation (NVML)", labels=["gpu", "uuid"])
        up = GaugeMetricFamily("gpuq_gpu_up", "1 while the GPU answers, 0 once lost", labels=["gpu", "uuid"])
        for line in picture.gpus:
            row, labels = line.row, [str(line.row.index), line.row.uuid]
            total.add_metric(labels, row.total)
            for holder, value in line.holders().items():
                memory.add_metric([*labels, holder], value)
            if line.utilization is not None:
                util.add_metric(labels, line.utilization / 100)
            up.add_metric(labels, 0 if row.state != "ok" else 1)
        yield from (total, memory, util, up)


def _host_use(records: list[JobRecord], running: list[JobRecord]) -> Iterator[Metric]:
    """Host CPU time (ended jobs as recorded, running ones so far) and the distribution of ended jobs' peak
    host memory. A job's figures are its last attempt's, so a retry that starts reads to Prometheus as a
    counter reset. Either is left out while no job has a figure (no cgroup, or no memory controller)."""
    now = {r.id: r for r in running}
    cpu: dict[str, float] = {}
    peaks: dict[str, list[int]] = {}
    for r in records:
        current = r if r.state.finished else now.get(r.id)
        if current is not None and current.cpu_seconds is not None:
            cpu[r.user] = cpu.get(r.user, 0.0) + current.cpu_seconds
        if r.state.finished and r.peak_ram is not None:
            peaks.setdefault(r.user, []).append(r.peak_ram)
    if cpu:
        seconds = CounterMetricFamily("gpuq_cpu_seconds", "Host CPU time of jobs, by user", labels=["user"])
        for user, used in sorted(cpu.items()):
            seconds.add_metric([user], used)
        yield seconds
    if peaks:
        ram = HistogramMetricFamily(
            "gpuq_job_peak_ram_bytes", "Peak host memory of ended jobs, by user", labels=["user"]
        )
        for user, sizes in sorted(peaks.items()):
            buckets = [(_le(b), sum(1 for s in sizes if s <= b)) for b in RAM_BUCKETS] + [("+Inf", len(sizes))]
            ram.add_metric([user], buckets, sum_value=float(sum(sizes)))
        yield ram


def _suspensions(users: dict[str, Moves]) -> Iterator[Metric]:
    if not users:
        return
    families = (
        ("gpuq_preemptions", "Times jobs were preempted, by user", "preemptions"),
        ("gpuq_suspends", "Suspends of jobs to host memory, by user", "suspends"),
        ("gpuq_suspend_bytes", "GPU state moved to host memory by suspends, by user", "bytes"),
        ("gpuq_suspended_seconds", "Time jobs spent suspended, by user", "seconds"),
    )
    for name, documentation, field in families:
        family = CounterMetricFamily(name, documentation, labels=["user"])
        for user, moved in sorted(users.items()):
            family.add_metric([user], float(getattr(moved, field)))
        yield family


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{bound:.1f}"


def exposition(
    picture: Callable[[], Picture],
    records: Callable[[], list[JobRecord]],
    moves: Callable[[], dict[int, Moves]] | None = None,
) -> Callable[[], bytes]:
    """What ``/metrics`` answers, made anew at each call."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(picture, records, moves))
    return lambda: generate_latest(registry)

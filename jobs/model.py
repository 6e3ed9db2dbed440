"""What a job is: its frozen spec and the record the queue keeps (its state and outcome: ``jobs.outcome``).

Plain data with JSON round-trips and no disk access; ``jobs.store.queue`` decides where it is written.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from gpuq_scheduler.jobs import plain
from gpuq_scheduler.jobs.causes import Cause
from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.naming import output_path, program_name
from gpuq_scheduler.jobs.options import OUTPUT, Option, kept_options
from gpuq_scheduler.jobs.outcome import JobState, Outcome, Step
from gpuq_scheduler.jobs.rules import check_spec, sweep_values

T = TypeVar("T")


class Mode(str, enum.Enum):
    """How a job uses the GPUs it was given. Its values are ``jobs.rules.MODES``, which the quick submit
    path checks ``--mode`` against without loading this module."""

    SINGLE = "single"  # one process (sees all its GPUs; usually it has one)
    DATAPARALLEL = "dataparallel"  # one process that sees all its GPUs, e.g. nn.DataParallel
    TORCHRUN = "torchrun"  # one process per GPU, started by torchrun on a port gpuq chose


@dataclass(frozen=True)
class JobSpec:
    """Everything the submitter asked for, captured at submit time. Immutable once queued.

    ``command`` is what the user typed; ``python`` is the interpreter captured for ``*.py`` commands.
    ``env`` is the submitter's environment: kept out of ``repr`` because it holds tokens and passwords.
    The options ``gpuq submit`` declares as kept (``jobs.options``) are read with ``value``: from a field of
    their name where there is one, else from ``options``, which holds the rest by their JSON keys.
    """

    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str] = field(repr=False, default_factory=dict)
    gpus: int = 1
    mem_per_gpu: int | None = None  # bytes on each GPU; None = whole GPUs
    name: str = ""
    priority: int = 0
    time_limit: float | None = None  # seconds
    mode: Mode = Mode.SINGLE
    python: str | None = None
    after: tuple[int, ...] = ()  # job or array ids that must end first
    after_any: bool = False  # False: they must succeed; True: however they ended
    retries: int = 0  # runs again up to this many times after a failure, with backoff
    oom_retry: bool = False  # after CUDA out of memory, retry with twice the memory (or a whole GPU)
    notify: str | None = None  # a shell command run when the job (or its whole array) ends
    # --mem auto: the daemon sets mem_per_gpu from the peaks of earlier jobs of the same kind, and says in
    # mem_from where it came from. ``like`` names one job to learn from; ``kind`` is a digest of the command
    # as typed (before {index}) and its cwd, fixed at submit time.
    mem_auto: bool = False
    like: int | None = None
    kind: str = ""
    mem_from: str = ""
    # An interactive job (`gpuq run`, `gpuq alloc`): the pid of the gpuq process whose program uses its
    # GPUs from the user's terminal. GPU processes under it count as the job's.
    client: int | None = None
    # A sweep over named values (`--array lr=1e-4,1e-3 --array seed=1,2`): each name and its values. Member k
    # of such an array runs the k-th combination, in itertools.product's order, with {name} in its command
    # replaced by its value; ``values`` are a member's own, kept to be shown.
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = ()
    values: tuple[tuple[str, str], ...] = ()
    # Host limits, enforced by the job's cgroup where its controllers are there (launcher.supervisor.containment).
    cpus: float | None = None  # CPUs' worth of time per second (cpu.max)
    ram: int | None = None  # bytes of host memory (memory.max)
    # --preemptible: a waiting job that outranks it may take its GPUs, suspending it (docs/suspend.md)
    preemptible: bool = False
    # The signal a --preemptible job gets before it is requeued where it cannot be suspended (None: SIGUSR1).
    preempt_signal: str | None = None
    # The options its script's #GPUQ lines gave (``jobs.directives``), as words: `gpuq show` says so.
    from_script: tuple[str, ...] = ()
    # What the job was given for the options jobs.options declares as kept that have no field of their own
    # here, by their JSON keys (``value`` reads them, typed).
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_spec(
            command=self.command,
            gpus=self.gpus,
            mem_per_gpu=self.mem_per_gpu,
            mode=self.mode.value,
            retries=self.retries,
            priority=self.priority,
            time_limit=self.time_limit,
            after=self.after,
            mem_auto=self.mem_auto,
            sweep=self.sweep,
            cpus=self.cpus,
            ram=self.ram,
            preempt_signal=self.preempt_signal,
        )

    def member(self, index: int) -> JobSpec:
        """One array member's spec: ``{index}`` in the command and name replaced by its index, and in a sweep
        each ``{name}`` by the member's value."""
        values = sweep_values(self.sweep, index) if self.sweep else ()
        words = (("{index}", str(index)), *(("{" + name + "}", value) for name, value in values))

        def fill(text: str) -> str:
            for placeholder, value in words:
                text = text.replace(placeholder, value)
            return text

        return dataclasses.replace(
            self,
            command=tuple(fill(word) for word in self.command),
            name=fill(self.name) if self.name else "",
            notify=None,  # an array notifies once, when every member has ended
            values=values,
        )

    def value(self, option: Option[T]) -> T:
        """What the job was given for a kept option (``jobs.options``), or the option's default."""
        if not option.field:
            raise ValueError(f"{option.flag} is not kept in the spec as given")
        if option.field in _OWN_FIELDS:
            return cast(T, getattr(self, option.field))
        return cast(T, self.options.get(option.field, option.kept_default))

    @property
    def interactive(self) -> bool:
        """A `gpuq run` or `gpuq alloc` job: its program runs in a user's terminal (``jobs.hold``)."""
        return self.client is not None or "gpuq_scheduler.jobs.hold" in self.command

    @property
    def display_name(self) -> str:
        return self.name or self.default_name

    @property
    def default_name(self) -> str:
        """The name of a job without a --name: its program (``program_name``), and a sweep member's values."""
        return " ".join([program_name(self.command), *(f"{name}={value}" for name, value in self.values)])

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON, in the order of the dict ``capture_spec`` makes: its own fields (``_STORED``, in
        their declared order, written by their types: ``jobs.plain``), then the kept options in theirs."""
        data = {name: write(getattr(self, name)) for name, write in _WRITE.items()}
        for option, _ in _KEPT:
            data[option.field] = self.value(option)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """Rebuild a spec, refusing wrong types: request files come from users and may be anything. A field
        left out holds its default; one without a default (the command, the cwd) must be there."""
        try:
            own = {
                name: read(data[name]) if name in data or name in _REQUIRED else plain.default(_FIELDS[name])
                for name, read in _READ.items()
            }
            kept = {key: read(data.get(key, _DEFAULTS[key])) for key, read in _READ_KEPT.items()}
            return cls(
                **own,
                **{key: value for key, value in kept.items() if key in _OWN_FIELDS},
                # An option left at its default is not kept: a spec built without it is the same spec.
                options={k: v for k, v in kept.items() if k not in _OWN_FIELDS and v != _DEFAULTS[k]},
            )
        except KeyError as missing:
            raise BadInput(f"job spec lacks {missing}") from None
        except ValueError as bad:
            raise BadInput(f"job spec has a bad value: {bad}") from None


_OWN_FIELDS = frozenset(spec_field.name for spec_field in dataclasses.fields(JobSpec)) - {"options"}
_KEPT = tuple((option, option.kept_default) for option in kept_options())  # with what each keeps when not given
_DEFAULTS = {option.field: default for option, default in _KEPT}
# A kept option's value, read as the type it declares (``stores``; or None, where that is what it keeps unless given).
_READ_KEPT = {
    option.field: plain.reader(option.stores if default is not None else option.stores | None, option.field)
    for option, default in _KEPT
}
# The spec's own fields its JSON holds by their types; the kept options (_KEPT) and ``options`` are written as
# ``jobs.options`` declares them. A new field is written and read back with no more code than its declaration.
_STORED = {name: hint for name, hint in plain.hints(JobSpec).items() if name != "options" and name not in _DEFAULTS}
_WRITE = {name: plain.writer(hint) for name, hint in _STORED.items()}
_READ = {name: plain.reader(hint, name) for name, hint in _STORED.items()}
_FIELDS = {spec_field.name: spec_field for spec_field in dataclasses.fields(JobSpec)}
_REQUIRED = frozenset(name for name, spec_field in _FIELDS.items() if plain.default(spec_field) is dataclasses.MISSING)


# Slots: past 30 fields (CPython's limit for keys its instances share), each record got a dict of its own, 1.3
# KB more (13 MB for 10,000 pending) and slower to read: the daemon's pass over them cost a sixth more.
@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as the queue knows it: the spec plus who, where, when and how it ended."""

    id: int
    spec: JobSpec
    uid: int
    user: str
    state: JobState
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    cause: Cause | None = None  # why it ended (None: it has not, or it ended before causes were recorded)
    culprit: int | None = None  # the job that took its GPU memory (Cause.OOM_VICTIM)
    peak_mem: int | None = None  # bytes, the most any one of its GPUs held for its processes
    # From its cgroup, where one accounted them, once it ended (`views.live.with_host_usage`: while it runs):
    cpu_seconds: float | None = None  # host CPU time of all its processes
    peak_ram: int | None = None  # bytes, the most host memory they held at once
    log: str = ""
    array_id: int | None = None  # the array this job is a member of (`gpuq submit --array`)
    array_index: int | None = None  # its index in that array ({index} in the command, GPUQ_ARRAY_INDEX)
    attempt: int = 1  # 1 for the first run, 2 for the first retry...
    held: bool = False  # held jobs stay pending until released
    cluster: str | None = None  # the cluster it was sent to (`gpuq submit --on`); None: this machine's queue
    external_id: str | None = None  # its id there: a Slurm job id, or ARRAYJOB_TASK for an array member
    node: str | None = None  # the cluster node it ran on
    energy: float | None = None  # joules of GPU energy charged to it (``launcher.policy.energy``); None: none
    # Suspended to host memory (`gpuq suspend`): the step in progress, the bytes of GPU state held in host
    # memory while suspended, since when (wall time), and the seconds of earlier suspensions.
    step: Step | None = None
    host_bytes: int | None = None
    suspended_at: float | None = None
    suspended_for: float = 0.0

    @property
    def output_file(self) -> str:
        """Where its ``--output`` copy of its log goes ("" for none): the pattern filled for this job."""
        pattern = self.spec.value(OUTPUT)
        if not pattern:
            return ""
        return output_path(pattern, self.spec.cwd, self.id, self.array_id, self.array_index, self.spec.display_name)

    def gpu_hours(self, now: float | None = None) -> float | None:
        """The GPUs it was given times the hours it held them (up to ``now`` while it runs), as fair share
        counts use; None if it never started (or runs, and no ``now`` is given)."""
        end = self.ended_at if self.ended_at is not None else now
        if self.started_at is None or end is None:
            return None
        return len(self.gpus) * max(0.0, end - self.started_at) / 3600

    def ended(self, outcome: Outcome, **changes: Any) -> JobRecord:
        """This record as ``outcome`` left it (plus ``changes``)."""
        return self.replace(
            state=outcome.state,
            exit_code=outcome.exit_code,
            signal=outcome.signal,
            reason=outcome.recorded_reason(),
            cause=outcome.cause,
            culprit=outcome.culprit,
            held=False,
            **changes,
        )

    def replace(self, **changes: Any) -> JobRecord:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The public view (``gpuq status --json``). Leaves out the environment: it may hold secrets."""
        return {
            "id": self.id,
            "name": self.spec.display_name,
            "user": self.user,
            "uid": self.uid,
            "state": self.state.value,
            "command": list(self.spec.command),
            "cwd": self.spec.cwd,
            "mode": self.spec.mode.value,
            "priority": self.spec.priority,
            "time_limit": self.spec.time_limit,
            "after": list(self.spec.after),
            "after_any": self.spec.after_any,
            "retries": self.spec.retries,
            "gpus_requested": self.spec.gpus,
            "gpus": list(self.gpus),
            "gpu_uuids": list(self.gpu_uuids),
            "mem_per_gpu": self.spec.mem_per_gpu,
            "mem_auto": self.spec.mem_auto,
            "mem_from": self.spec.mem_from,
            "cpus": self.spec.cpus,  # host limits (--cpus, --ram): None where not asked
            "ram": self.spec.ram,
            "preemptible": self.spec.preemptible,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "cause": None if self.cause is None else self.cause.value,
            "culprit": self.culprit,
            "peak_mem": self.peak_mem,
            "cpu_seconds": self.cpu_seconds,
            "peak_ram": self.peak_ram,
            "log": self.log,
            "array_id": self.array_id,
            "array_index": self.array_index,
            "values": dict(self.spec.values),  # a sweep member's own (--array lr=...)
            "attempt": self.attempt,
            "held": self.held,
            "cluster": self.cluster,
            "external_id": self.external_id,
            "node": self.node,
            "gpu_hours": self.gpu_hours(),
            "gpu_energy_j": self.energy,
            "step": None if self.step is None else self.step.value,  # a suspend or resume under way
            "host_bytes": self.host_bytes,  # suspended: its GPU state in host memory
            "suspended_for": self.suspended_for,  # seconds of suspensions that ended
        }


@dataclass(frozen=True)
class Launch:
    """What the launcher needs to find a running job again after a restart."""

    shim_pid: int
    shim_start: float  # the shim's process start time: with the pid it names one process, never a reused pid
    boot_id: str  # a different boot id means the machine restarted under the job
    port: int | None = None  # torchrun's master port
    cancel_by: str | None = None  # set when a cancel was sent, so the exit is recorded as a cancel


@dataclass(frozen=True)
class ArrayInfo:
    """An array of jobs submitted together (`gpuq submit --array`); members share its environment."""

    id: int
    uid: int
    user: str
    name: str
    size: int
    throttle: int | None
    env: Mapping[str, str] = field(repr=False, default_factory=dict)
    notify: str | None = None
    submitted_at: float = 0.0
    notified: bool = False

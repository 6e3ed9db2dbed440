"""The only code that knows the names of files inside the state directory.

$GPUQ_HOME/
  daemon.lock      held by the daemon for its whole life; probing it tells whether one runs
  daemon.pid       the daemon's pid, for `gpuq daemon stop`
  daemon.ready     its pid again, once its first pass is done: `gpuq daemon start` returns then
  daemon.log       the daemon's own log
  wake.fifo        clients write a byte here after a request; the daemon sleeps on it
  next_id          a personal queue's id counter, advanced under flock by its user's clients (mode 0600)
  spool/           one request file per submit or cancel (written to a temp name, renamed in); a shared
                   queue's submit is named by a random token, and its daemon gives the id
  answers/<token>  shared mode: the id given to the submit named <token> (root's; not listable)
  spool/rejected/  request files that could not be read, set aside with a note
  jobs.db          the job table (SQLite, WAL), written by the daemon only
  clusters.db      jobs sent to clusters (`gpuq submit --on`): written by clients, under SQLite's locking
  gpus.json        the last GPU inventory the daemon saw (lets `gpuq submit` check --gpus without NVML)
  run/<id>.exit    written by a job's shim when the job ends: the outcome survives a daemon crash
  run/<id>.pid     the job's own pid and start time, written by its shim
  run/<id>.next    the daemon's: this pending job is staged behind a running one, whose shim starts it
                   when that one ends (launcher.daemon.handoff); read back by a restarted daemon
  mps/<gpu uuid>/  pipe and log directories of the MPS control daemon gpuq runs on that GPU (launcher.gpus.mps)
  logs/<id>.log    the job's stdout and stderr (<id>.notify.log: its --notify command's)
  private/<id>.json  shared mode: a job's (or array's) command, cwd and environment, readable by its
                   owner and the admin group only (jobs.db then holds only what everyone may see)
  events.jsonl     append-only journal of state transitions

Shared mode (a root daemon for a whole machine) sets permissions so that users can drop requests in the
spool and read the queue but nothing else: the spool is like cron's (sticky, writable, not listable).

Writing a file there whole (a temp file renamed in) is ``jobs.store.atomic``'s.
"""

from __future__ import annotations

import os

from gpuq_scheduler.jobs.errors import StateDirError
from gpuq_scheduler.jobs.locations import any_config
from gpuq_scheduler.jobs.store.atomic import discard

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

REQUEST_SCHEMA = 1  # of the spool's request files: ``outbox`` writes it, ``spool`` refuses any other
TABLE_VERSION = 5  # of the job table (``jobs.store.schema`` lays it out; the quick suspend reads one this new)

# The names the quick ``gpuq submit`` path opens as plain strings (``StateDir.at``): it imports no pathlib,
# so it builds no Path.
NEXT_ID = "next_id"
SPOOL = "spool"
WAKE = "wake.fifo"
INNER_WAKE = "wake.fifo"  # inside RUN: the FIFO only the daemon's own shims and helpers can write
INVENTORY = "gpus.json"
DB = "jobs.db"  # the quick `gpuq suspend` reads the job table (``jobs.store.suspend_requests``)
CLUSTERS_DB = "clusters.db"
# Directories whose files are named per job (``StateDir.exit_file`` and its neighbours) or per request.
RUN = "run"
LOGS = "logs"
PRIVATE = "private"
REJECTED = "rejected"  # inside SPOOL
ANSWERS = "answers"
NOTICES = "notices"  # what the daemon tells readers: requests it set aside (one file per owner), failing passes


def submit_name(job_id: int) -> str:
    return f"submit-{job_id:012d}.json"


def read_bytes(path: str) -> bytes:
    """A file's contents, by a string path (``StateDir.exit_file`` says why a job's files have no Path)."""
    with open(path, "rb") as handle:
        return handle.read()


def _path(text: str) -> Path:
    from pathlib import Path

    return Path(text)


def home_text(env: Mapping[str, str] | None = None) -> str:
    """The state directory to use, absolute (as ``Path.absolute``: not resolved), as a string."""
    env = os.environ if env is None else env
    home = os.path.expanduser(env["GPUQ_HOME"]) if env.get("GPUQ_HOME") else _configured_home(env)
    return home if os.path.isabs(home) else os.path.join(os.getcwd(), home)


def _configured_home(env: Mapping[str, str]) -> str:
    if any_config(env):  # jobs.config (dataclasses, a TOML parser) loads only when there is a file to read
        from gpuq_scheduler.jobs import config

        configured = config.load(env).home
        if configured is not None:
            return os.fspath(configured)
    state = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "gpuq")


class StateDir:
    """One state directory: an immutable value (equal, hashable) naming the files in it.

    A plain class, not a dataclass: the quick ``gpuq submit`` path must not pay for importing dataclasses.
    It holds its directory as a string (``text``) and builds ``root``, a Path, on first use.
    """

    __slots__ = ("_root", "text")
    text: str
    _root: Path | None

    def __init__(self, root: str | os.PathLike[str]) -> None:
        text = os.fspath(root)
        object.__setattr__(self, "text", text.rstrip("/") or text)
        object.__setattr__(self, "_root", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"StateDir is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"StateDir is immutable: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StateDir):
            return NotImplemented
        return self.text == other.text

    def __hash__(self) -> int:
        return hash((self.text,))

    def __repr__(self) -> str:
        return f"StateDir({self.text!r})"

    def __reduce__(self) -> tuple[type[StateDir], tuple[str]]:
        return StateDir, (self.text,)  # pickling and copying go through __init__, not the refused __setattr__

    @classmethod
    def from_env(cls) -> StateDir:
        return cls(home_text())

    @property
    def root(self) -> Path:
        root: Path | None = self._root
        if root is None:
            root = _path(self.text)
            object.__setattr__(self, "_root", root)
        return root

    def owner(self) -> int:
        """Who owns the queue: the state directory's owner, the user its daemon runs as (root for a shared
        queue). The one answer both the clients and the daemon use."""
        return os.stat(self.text).st_uid

    def at(self, *names: str) -> str:
        """A path in the directory as a string, for the quick submit path (``NEXT_ID``, ``SPOOL``, ...)."""
        return os.path.join(self.text, *names)

    @property
    def lock(self) -> Path:
        return self.root / "daemon.lock"

    @property
    def pid(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def ready(self) -> Path:  # written by the daemon once its first pass is done
        return self.root / "daemon.ready"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def wake(self) -> Path:
        return self.root / WAKE

    @property
    def inner_wake(self) -> Path:
        """The wake FIFO of the daemon's own shims and helpers: in ``run/``, where no user can write, so a
        poke on it wakes a pass at once, where one on ``wake`` (anyone's) is coalesced (``lifetime``)."""
        return self.root / RUN / INNER_WAKE

    @property
    def next_id(self) -> Path:
        return self.root / NEXT_ID

    @property
    def spool(self) -> Path:
        return self.root / SPOOL

    @property
    def rejected(self) -> Path:
        return self.spool / REJECTED

    @property
    def answers(self) -> Path:
        return self.root / ANSWERS

    def answer(self, token: str) -> str:  # a string: named per request, as a job's files are (see below)
        return self.at(ANSWERS, token)

    @property
    def db(self) -> Path:
        return self.root / DB

    @property
    def clusters_db(self) -> Path:
        return self.root / CLUSTERS_DB

    @property
    def inventory(self) -> Path:
        return self.root / INVENTORY

    @property
    def run(self) -> Path:
        return self.root / RUN

    @property
    def mps(self) -> Path:
        return self.root / "mps"

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def private(self) -> Path:
        return self.root / PRIVATE

    # A job's own files (and a request's) are named by strings, not Paths: pathlib interns every name it
    # parses, and some Pythons never free an interned string (3.12 before 3.12.7, CPython gh-121780), so a
    # long-lived daemon or shim must not make a Path of each job's files. The os functions take either;
    # tests/test_long_lived.py checks that no gpuq process interns them.
    def private_file(self, job_id: int) -> str:
        return self.at(PRIVATE, f"{job_id}.json")

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    def submit_request(self, job_id: int) -> str:
        return self.at(SPOOL, submit_name(job_id))

    def token_request(self, token: str) -> str:  # a shared queue's submit, named by a token its client alone knows
        return self.at(SPOOL, f"submit-{token}.json")

    def cancel_request(self, token: str) -> str:
        return self.at(SPOOL, f"cancel-{token}.json")

    def control_request(self, token: str) -> str:
        return self.at(SPOOL, f"control-{token}.json")

    def exit_file(self, job_id: int) -> str:
        return self.at(RUN, f"{job_id}.exit")

    def pid_file(self, job_id: int) -> str:
        return self.at(RUN, f"{job_id}.pid")

    def pause_file(self, job_id: int) -> str:
        """How long a job was suspended (``gpuq suspend``), for its shim's time limit."""
        return self.at(RUN, f"{job_id}.paused")

    def next_file(self, job_id: int) -> str:
        return self.at(RUN, f"{job_id}.next")

    def fast_dir(self, job_id: int) -> str:
        """The job's own directory for the fast suspend's answers (``jobs.fastsuspend``): a --preemptible job's."""
        return self.at(RUN, f"{job_id}.fast")

    def restarts_file(self, job_id: int) -> str:
        """How often a job was preempted and requeued (``GPUQ_RESTART_COUNT``), until it ends."""
        return self.at(RUN, f"{job_id}.restarts")

    def log(self, job_id: int) -> str:
        return self.at(LOGS, f"{job_id}.log")

    def notify_log(self, job_id: int) -> str:
        return self.at(LOGS, f"{job_id}.notify.log")

    def exists(self) -> bool:
        return os.path.isdir(self.at(SPOOL))

    def is_shared(self) -> bool:
        """A shared queue (its spool is sticky, like cron's), whoever asks: there the daemon gives the ids."""
        try:
            return bool(os.stat(self.at(SPOOL)).st_mode & 0o1000) or self.is_foreign()
        except OSError:
            return self.is_foreign()

    def is_foreign(self) -> bool:
        """True for a queue run by someone else (a shared queue): it is not ours to set up or start."""
        try:
            return os.stat(self.text).st_uid != os.geteuid()
        except OSError:
            return False

    def ensure(self) -> None:
        """Create the directory tree (private to the user) and the wake FIFO if they are missing.

        Someone else's queue (a shared one) is only checked: we need to be able to drop requests in it.
        """
        if self.is_foreign():
            if not os.access(self.at(SPOOL), os.W_OK | os.X_OK):
                raise StateDirError(
                    f"you cannot submit to the queue in {self.text}: its spool is not writable by you; "
                    "ask its admin (a shared queue is set up with `gpuq daemon setup`)"
                )
            return
        try:
            for directory in ((), (SPOOL,), (SPOOL, REJECTED), (RUN,), (LOGS,)):
                os.makedirs(self.at(*directory), mode=0o700, exist_ok=True)
            _make_fifo(self.at(WAKE), 0o600)
            _make_fifo(self.at(RUN, INNER_WAKE), 0o600)
        except OSError as err:
            raise StateDirError(
                f"cannot set up the state directory {self.text}: {err.strerror}; "
                "set GPUQ_HOME to a directory you can write"
            ) from None
        if not os.access(self.text, os.R_OK | os.W_OK | os.X_OK):
            raise StateDirError(
                f"the state directory {self.text} is not writable by you; set GPUQ_HOME to a directory you can write"
            )

    def ensure_shared(self) -> None:
        """Set up (or repair) a shared queue's tree, as root: everyone may read the queue and drop requests,
        nobody but root may change anything else. Logs and private files get their owners' permissions
        one by one as they are written."""
        modes = {
            self.root: 0o755,
            self.spool: 0o1733,
            self.rejected: 0o700,
            self.run: 0o700,
            self.logs: 0o711,
            self.private: 0o711,
            self.answers: 0o711,
        }
        try:
            for directory, mode in modes.items():
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                if os.lstat(directory).st_uid != 0:
                    raise StateDirError(f"{directory} must belong to root for a shared queue; it does not")
                os.chown(directory, 0, 0)
                os.chmod(directory, mode)
            _make_fifo(os.fspath(self.wake), 0o622)
            os.chmod(self.wake, 0o622)  # anyone may wake the daemon
            _make_fifo(os.fspath(self.inner_wake), 0o600)
            if os.path.exists(self.lock):  # root's alone: one others can open, they can flock (lifetime.running_pid)
                os.chmod(self.lock, 0o600)
            # The daemon gives a shared queue's ids: a counter its users could write (as earlier gpuq's was)
            # would let one user decide another's job id.
            discard(os.fspath(self.next_id))
        except OSError as err:
            raise StateDirError(f"cannot set up the shared queue in {self.root}: {err.strerror}") from None


# Not contextlib.suppress: contextlib (with functools) costs ~1 ms of the quick `gpuq submit`.
def _make_fifo(path: str, mode: int) -> None:
    try:
        os.mkfifo(path, mode)
    except FileExistsError:
        return  # made by an earlier client or daemon

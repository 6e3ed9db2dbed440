"""The MPS control daemons of the fence, started and quit beside the scheduling pass, never inside it.

Each (GPU, user) with packed jobs has one control daemon (``gpus.mps``). Starting or quitting one runs its
control command as a child process that the daemon polls once a pass: a control daemon that wedges holds
up only the jobs that wait for it (they say so: "waiting for its MPS fence on GPU 0"), and each command
has a deadline, after which it is killed and counted as failed.

A control daemon moves through the phases of ``Phase``. A failed start leaves its jobs the cooperative
fence (``daemon.fences``), and is tried again for a later job after ``RETRY``. A failed quit is never
forgotten: its folder stays with a note saying why, the quit is tried again (after ``RETRY``, doubling
to ``RETRY_MOST``), a new job for that (GPU, user) waits for it, and `gpuq doctor` lists it; a quit that
failed because the control daemon was gone already is a quit.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuq_scheduler.jobs.accounts import Account
from gpuq_scheduler.launcher.gpus.mps import CONTROL, Key, Mps

log = logging.getLogger("gpuq.fences")

TIMEOUT = 30.0  # seconds a control command may run (the real `-d` and `quit` return in well under one)
RETRY = 30.0  # seconds before a failed start may be tried again, and before a failed quit is
RETRY_MOST = 600.0


class Phase(str, enum.Enum):
    STARTING = "starting"  # its `-d` runs
    UP = "up"  # its server takes clients
    FAILED = "failed"  # it did not start: its jobs get the cooperative fence until ``retry_at``
    QUITTING = "quitting"  # its `quit` runs
    QUIT_FAILED = "quit-failed"  # it did not quit: kept, and tried again at ``retry_at``


@dataclass
class Control:
    key: Key
    account: Account | None
    phase: Phase
    command: subprocess.Popen[str] | None = None
    deadline: float = 0.0
    why: str = ""
    retry_at: float = 0.0
    failures: int = 0
    quit_when_up: bool = False  # its last job ended (or never came) while it was starting


class Controls:
    """Every control daemon this gpuq daemon knows, by key."""

    def __init__(
        self,
        mps: Mps,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = TIMEOUT,
        retry: float = RETRY,
        on_settled: Callable[[], None] = lambda: None,
    ) -> None:
        """``timeout``: seconds a control command may run; ``retry``: before a failed one is tried again;
        ``on_settled``: called whenever a control daemon came up or failed to start (the jobs placed on it
        may go: the scheduler's placement looks again)."""
        self.mps = mps
        self.on_settled = on_settled
        self.clock = clock
        self.timeout = timeout
        self.retry = retry
        self.known: dict[Key, Control] = {}

    def phase(self, key: Key) -> Phase | None:
        control = self.known.get(key)
        return None if control is None else control.phase

    def why(self, key: Key) -> str:
        control = self.known.get(key)
        return "" if control is None else control.why

    def start(self, key: Key, account: Account | None) -> None:
        """See that the control daemon of ``key`` runs or is starting (one that failed: once ``RETRY`` passed)."""
        control = self.known.get(key)
        now = self.clock()
        if control is not None:
            control.quit_when_up = False
            if control.phase is not Phase.FAILED or now < control.retry_at:
                return
        control = self.known[key] = Control(key, account, Phase.STARTING)
        try:
            control.command = self.mps.begin_start(key, account)
        except OSError as err:
            self._failed_start(control, f"{CONTROL} -d could not run: {err}")
            return
        control.deadline = now + self.timeout

    def quit(self, key: Key) -> None:
        """Quit the control daemon of ``key``: its last packed job has ended."""
        control = self.known.get(key)
        if control is None:
            return
        if control.phase is Phase.STARTING:
            control.quit_when_up = True
        elif control.phase in (Phase.UP, Phase.FAILED):
            self._begin_quit(control)

    def adopt(self, key: Key, account: Account | None, *, serving: bool) -> None:
        """A control daemon an earlier daemon left (its folder is there): up for the running jobs it
        ``serving``, else quit now."""
        control = self.known[key] = Control(key, account, Phase.UP)
        if not serving:
            self._begin_quit(control)

    def reaped(self, pid: int, status: int) -> None:
        """The gpuq daemon collected child ``pid`` with wait status ``status``: if it is a control command,
        that is its exit code."""
        for control in self.known.values():
            if control.command is not None and control.command.pid == pid:
                control.command.returncode = os.waitstatus_to_exitcode(status)

    @property
    def busy(self) -> bool:
        """Whether a command runs or a quit waits to be tried again: the daemon then looks again soon."""
        return any(c.command is not None or c.phase is Phase.QUIT_FAILED for c in self.known.values())

    def poll(self) -> list[Key]:
        """Collect the control commands that ended (or ran past their deadline), and try failed quits again
        when due. The keys whose control daemon came up or failed to start (their waiting jobs may go)."""
        settled = []
        now = self.clock()
        for control in list(self.known.values()):
            if control.command is None:
                if control.phase is Phase.QUIT_FAILED and now >= control.retry_at:
                    self._begin_quit(control)
                continue
            code = control.command.poll()
            if code is None and now < control.deadline:
                continue
            output = _finish(control.command)
            control.command = None
            if control.phase is Phase.STARTING:
                settled.append(control.key)
                if code == 0:
                    control.phase, control.failures, control.why = Phase.UP, 0, ""
                    if control.quit_when_up:
                        self._begin_quit(control)
                else:
                    what = f"did not return within {self.timeout:g}s" if code is None else f"exited {code}"
                    self._failed_start(control, f"{CONTROL} -d {what}{output}")
            elif code == 0 or not self.mps.alive(control.key):
                self.mps.forget(control.key)
                del self.known[control.key]
            else:
                what = f"did not return within {self.timeout:g}s" if code is None else f"exited {code}"
                self._failed_quit(control, f"quit {what}{output}")
        if settled:
            self.on_settled()
        return settled

    def close(self, serving: Iterable[Key], timeout: float = 10.0) -> None:
        """The gpuq daemon stops: quit every control daemon no running job uses, waiting ``timeout`` seconds
        at most. One still quitting then is killed and noted (its folder stays for the next daemon)."""
        keep = set(serving)
        for control in list(self.known.values()):
            if control.key not in keep and control.command is None:
                self._begin_quit(control)
        deadline = self.clock() + timeout
        while any(c.command is not None for c in self.known.values()) and self.clock() < deadline:
            self.poll()
            time.sleep(0.02)
        for control in self.known.values():
            if control.command is not None:
                _finish(control.command)
                control.command = None
                self._failed_quit(control, "quit did not finish before the gpuq daemon stopped")

    def _begin_quit(self, control: Control) -> None:
        control.phase, control.quit_when_up = Phase.QUITTING, False
        try:
            control.command = self.mps.begin_quit(control.key, control.account)
        except OSError as err:
            self._failed_quit(control, f"{CONTROL} could not run: {err}")
            return
        control.deadline = self.clock() + self.timeout

    def _failed_start(self, control: Control, why: str) -> None:
        control.phase, control.why = Phase.FAILED, why
        control.failures += 1
        control.retry_at = self.clock() + self.retry
        log.warning("MPS control daemon %s: %s; its packed jobs get the cooperative fence", control.key, why)
        if control.quit_when_up or self.mps.alive(control.key):
            self._begin_quit(control)  # half up, perhaps: a quit cleans up, and its failure is kept
        else:
            self.mps.forget(control.key)

    def _failed_quit(self, control: Control, why: str) -> None:
        control.phase, control.why = Phase.QUIT_FAILED, why
        control.failures += 1
        control.retry_at = self.clock() + min(self.retry * 2 ** (control.failures - 1), RETRY_MOST)
        self.mps.note_failure(control.key, why)
        wait = control.retry_at - self.clock()
        log.warning("MPS control daemon %s: %s; kept, tried again in %.0fs", control.key, why, wait)


def _finish(command: subprocess.Popen[str]) -> str:
    """End a control command (killed, with its group, if it still runs) and what it said, for a reason."""
    if command.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(command.pid, signal.SIGKILL)
        command.wait()
    said = ""
    if command.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(command.stdout.fileno(), False)
            said = (command.stdout.read() or "").strip()[:200]
        command.stdout.close()
    return f": {said}" if said else ""

"""Starting a job's first process inside its cgroup with glibc's own posix_spawn: a vfork into the cgroup
(``POSIX_SPAWN_SETCGROUP``, glibc 2.39 on Ubuntu 24.04, through ``clone3``), where ``intocgroup`` copies the
shim. Called through ctypes, because Python's ``os.posix_spawn`` has no cgroup argument.

On a lent H200 host (glibc 2.39, 16 cores, 2026-11-27) a bare spawn and wait took 1.2 ms and a clone into a
cgroup 3.6-3.9 ms (bench/containment_cost.py): the copy of a shim, a fork of the daemon, and its teardown at
the exec. posix_spawn shares the shim's memory until the exec instead, as it did before jobs had cgroups.

It cannot change the user a job runs as (POSIX_SPAWN_RESETIDS would keep root as the saved user id), so a
shared queue's jobs, which run as their users, are still cloned. Where the C library lacks the call
(glibc before 2.39, musl), ``usable`` is False and the shim clones too.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

EVERY_SIGNAL = tuple(int(signum) for signum in signal.valid_signals())  # numbers: sets of enums cost 100 us
_SETSIGDEF, _SETSID, _SETCGROUP = 0x04, 0x80, 0x100  # <spawn.h>: POSIX_SPAWN_SETSIGDEF, _SETSID, _SETCGROUP
_OPAQUE = 1024  # bytes for posix_spawnattr_t (336 on x86-64) and posix_spawn_file_actions_t (80): ample


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)  # CDLL: the GIL is let go during the call, as os.posix_spawn does
    return libc if hasattr(libc, "posix_spawnattr_setcgroup_np") else None


FORCE = "GPUQ_SPAWN"  # "clone": clone even where the C library could spawn (tests of the clone's ways)


def usable() -> bool:
    """Whether this C library can spawn into a cgroup (and is let to)."""
    return os.environ.get(FORCE) != "clone" and _libc() is not None


class Prepared:
    """The start of a job in ``cgroup``, as ``processes.spawn`` does (its own session, stdin /dev/null, stdout
    and stderr to ``output``, no descriptor of the shim's but those, SIGPIPE, SIGXFSZ and the shim's handled
    signals back to default, the shim's signal mask), its C structures built now; ``given`` adds the program
    (a path: found already), its ``argv``, ``env`` and ``cwd``; ``run`` starts it (its pid), ``close`` lets it
    go. Built when a job is staged behind a running one, only ``posix_spawn`` itself is left at its turn: the
    rest, in Python through ctypes, took 0.25 ms of a hand-off on a lent H200 (2026-11-27)."""

    def __init__(self, cgroup: str, output: int) -> None:
        libc = _libc()
        self._attr, self._actions = ctypes.create_string_buffer(_OPAQUE), ctypes.create_string_buffer(_OPAQUE)
        self._where = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        libc.posix_spawnattr_init(self._attr)
        libc.posix_spawn_file_actions_init(self._actions)
        self._program = b""
        try:
            _check(libc.posix_spawnattr_setflags(self._attr, ctypes.c_short(_SETSIGDEF | _SETSID | _SETCGROUP)))
            _check(libc.posix_spawnattr_setsigdefault(self._attr, _sigset(to_default())))
            _check(libc.posix_spawnattr_setcgroup_np(self._attr, self._where))
            _check(libc.posix_spawn_file_actions_addopen(self._actions, 0, os.devnull.encode(), os.O_RDONLY, 0))
            _check(libc.posix_spawn_file_actions_adddup2(self._actions, output, 1))
            _check(libc.posix_spawn_file_actions_adddup2(self._actions, output, 2))
            _check(libc.posix_spawn_file_actions_addclosefrom_np(self._actions, 3))
        except OSError:
            self.close()
            raise

    def given(self, program: str, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Prepared:
        """The job it starts (this, now whole). OSError if its directory cannot be set (it is closed then)."""
        try:
            _check(_libc().posix_spawn_file_actions_addchdir_np(self._actions, os.fsencode(cwd)))
        except OSError:
            self.close()
            raise
        words = [os.fsencode(word) for word in argv]
        pairs = [os.fsencode(key) + b"=" + os.fsencode(value) for key, value in env.items()]
        self._program = os.fsencode(program)
        self._argv = (ctypes.c_char_p * (len(words) + 1))(*words, None)
        self._envp = (ctypes.c_char_p * (len(pairs) + 1))(*pairs, None)
        return self

    def run(self) -> int:
        """Spawn it now: its pid. OSError if it cannot start (the exec's error, as posix_spawn reports it)."""
        try:
            pid = ctypes.c_int(0)
            code = _libc().posix_spawn(
                ctypes.byref(pid), self._program, self._actions, self._attr, self._argv, self._envp
            )
            _check(code, self._program.decode(errors="replace"))
            return pid.value
        finally:
            self.close()

    def close(self) -> None:
        if self._where >= 0:
            _libc().posix_spawn_file_actions_destroy(self._actions)
            _libc().posix_spawnattr_destroy(self._attr)
            os.close(self._where)
            self._where = -1


def to_default() -> list[int]:
    """The signals a job must get at their defaults: those this process handles in Python, and SIGPIPE and
    SIGXFSZ, which Python ignores and an exec would keep ignored."""
    return [s for s in EVERY_SIGNAL if callable(signal.getsignal(s))] + [signal.SIGPIPE, signal.SIGXFSZ]


def _sigset(signals: Sequence[int]) -> ctypes.Array[ctypes.c_char]:
    """A sigset_t (1024 bits in glibc) holding ``signals``."""
    bits = sum(1 << (int(signum) - 1) for signum in set(signals))
    return ctypes.create_string_buffer(bits.to_bytes(128, "little"), 128)


def _check(code: int, name: str | None = None) -> None:
    """posix_spawn and its helpers return an error number, 0 for none."""
    if code:
        raise OSError(code, os.strerror(code), *([name] if name else []))

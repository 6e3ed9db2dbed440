"""Reading and writing a cgroup's files: few system calls, no buffering (``containment``, ``limits``)."""

from __future__ import annotations

import contextlib
import os


def words(path: str) -> list[str]:
    """The words of a cgroup's file, read with three system calls (open() takes eight)."""
    data, fd = b"", -1
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        while chunk := os.read(fd, 65536):
            data += chunk
    if fd >= 0:
        os.close(fd)
    return data.decode(errors="replace").split()


def write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def keyed(path: str) -> dict[str, int]:
    """A flat keyed file (``cpu.stat``, ``memory.events``, ``pids.events``) as numbers by name."""
    found: dict[str, int] = {}
    items = words(path)
    for name, value in zip(items[::2], items[1::2], strict=False):
        with contextlib.suppress(ValueError):
            found[name] = int(value)
    return found

"""How gpuq writes a file that others read, in the state directory or beside it (``/etc``): whole or not at
all (a temp file renamed in), durable where asked (fsynced, its directory too), and safe where others may write
(a temp file nobody can predict, never through a link). Light: the quick ``gpuq submit`` writes through it.
"""

from __future__ import annotations

import errno
import os

from gpuq_scheduler.jobs.errors import StateDirError


# Temp files are made where others may write (a shared queue's spool): exclusively, never through a link, under
# a name nobody can guess (os.urandom is what secrets.token_hex reads; importing secrets, with hmac and random,
# cost 9 ms here), so another user can neither read what we write nor make us write elsewhere.
def new_temp(path: str | os.PathLike[str], mode: int = 0o600) -> tuple[int, str]:
    """The temp file ``write_atomic`` fills for ``path``, open: (fd, ``.<name>.<random>.tmp`` beside it)."""
    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f".{name}.{os.urandom(8).hex()}.tmp")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), tmp


def write_atomic(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    durable: bool = True,
    mode: int = 0o600,
    opened: tuple[int, str] | None = None,
) -> None:
    """Write ``data`` to a new temp file beside ``path`` and rename it in, so readers see all or nothing.

    ``durable`` fsyncs the file and its directory: a submit that returned an id survives a reboot.
    On failure (a full disk, say) the temp file is removed and nothing is left half-written.
    ``opened``: that temp file (``new_temp``), made ahead by the caller; closed here.
    """
    target = os.fspath(path)
    directory = os.path.dirname(target)
    tmp = ""
    try:
        fd, tmp = new_temp(target, mode) if opened is None else opened
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        if durable:
            _sync_directory_of(target)
    except OSError as err:
        if tmp:
            discard(tmp)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StateDirError(
                f"no space left to write {target}: free some disk space under {directory or '.'} and try again"
            ) from None
        raise StateDirError(f"cannot write {target}: {err.strerror}") from None


# Not contextlib.suppress: contextlib (with functools) costs ~1 ms of the quick `gpuq submit`.
def discard(path: str) -> None:
    """Remove a file if it is there."""
    try:
        os.unlink(path)
    except OSError:
        return  # never made, or gone already


def _sync_directory_of(path: str) -> None:
    """Make a rename into ``path``'s directory durable. A shared queue's spool cannot be opened by its users
    (it is write-only, like cron's): then the renamed file is synced once more, which on ext4 and XFS commits
    the journal that holds the rename too (POSIX does not promise it; the daemon's ingest, moments later,
    is fsynced either way)."""
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

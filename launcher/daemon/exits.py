"""What a shim says in a job's exit file about why the job's process ended, one definition for the shim
that writes it and the daemon that reads it (``daemon.outcomes``)."""

from __future__ import annotations

import enum


class Stop(str, enum.Enum):
    """Whether the shim stopped the job, and why; stored as its value in the exit file's ``reason``."""

    NONE = ""  # the shim sent no signal: the job ended by itself (or by a signal from elsewhere)
    CANCEL = "cancel"  # a cancel came (down the pipe, or as a SIGTERM to the shim)
    TIMEOUT = "timeout"  # its time limit passed

"""What a control request asks the daemon to do: one definition the client that writes the request
(``jobs.store.outbox``), the spool that reads it (``jobs.store.spool``) and the daemon that carries it out
(``launcher.daemon.requests``) all import, so none of them spells an action as a string of its own.
"""

from __future__ import annotations

import enum


class Action(str, enum.Enum):
    """The ``action`` of a control request (a cancel is a request of its own kind)."""

    HOLD = "hold"
    RELEASE = "release"
    UPDATE = "update"
    DRAIN = "drain"
    UNDRAIN = "undrain"
    PAUSE = "pause"
    UNPAUSE = "unpause"
    SUSPEND = "suspend"
    RESUME = "resume"
    RESERVE = "reserve"
    UNRESERVE = "unreserve"

    def __str__(self) -> str:  # said in messages and logs as the command's word: "hold", not "Action.HOLD"
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def on_queue(self) -> bool:
        """Whether it acts on the whole queue or its GPUs (the queue's owner, an admin or root may)."""
        return self in (Action.DRAIN, Action.UNDRAIN, Action.PAUSE, Action.UNPAUSE)

    @property
    def on_pending(self) -> bool:
        """Whether it acts on the pending jobs it names (each job's owner, an admin or root may)."""
        return self in (Action.HOLD, Action.RELEASE, Action.UPDATE)

    @property
    def on_reservations(self) -> bool:
        """Whether it makes or cancels a reservation: it names no job and no GPU, its values say what."""
        return self in (Action.RESERVE, Action.UNRESERVE)

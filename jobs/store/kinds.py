"""What a line of the journal says happened: its ``event``, one value per kind. The typed events that carry
each kind's facts are ``jobs.store.events`` (which names this enum too); the words and the facts are two
concerns, and one module of both passed 400 lines.
"""

from __future__ import annotations

import enum

from gpuq_scheduler.jobs.store.actions import Action


class Kind(str, enum.Enum):
    """What happened: the ``event`` of a line of the journal."""

    SUBMITTED = "submitted"
    STARTED = "started"
    SUCCEEDED = "succeeded"  # a job's end: its state's value (``Ended``)
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    LOST = "lost"
    RETRY = "retry"
    REQUEUED = "requeued"
    ARRAY_HELD = "held"  # an array's pending members held, its failures past its limit
    CANCEL_REQUESTED = "cancel-requested"
    HOLD = "hold"  # a control action done: its action's value (``Kind.done``)
    RELEASE = "release"
    UPDATE = "update"
    DRAIN = "drain"
    UNDRAIN = "undrain"
    PAUSE = "pause"
    UNPAUSE = "unpause"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    SUSPEND_UNDONE = "suspend-undone"
    RESUME_REQUESTED = "resume-requested"
    RESUMING = "resuming"
    RESUMED = "resumed"
    RESUME_FAILED = "resume-failed"
    POOL_GIVEN_BACK = "pool-given-back"  # a job told to unpin the host memory it kept (``daemon.suspension.pools``)
    CANCEL_REFUSED = "cancel-refused"  # a request refused: its action's value, "-refused" (``Kind.refused``)
    HOLD_REFUSED = "hold-refused"
    RELEASE_REFUSED = "release-refused"
    UPDATE_REFUSED = "update-refused"
    DRAIN_REFUSED = "drain-refused"
    UNDRAIN_REFUSED = "undrain-refused"
    PAUSE_REFUSED = "pause-refused"
    UNPAUSE_REFUSED = "unpause-refused"
    SUSPEND_REFUSED = "suspend-refused"
    RESUME_REFUSED = "resume-refused"
    RESERVE_REFUSED = "reserve-refused"
    UNRESERVE_REFUSED = "unreserve-refused"
    REJECTED = "rejected"  # a request file set aside
    WATCHDOG = "watchdog"
    GPU_LOST = "gpu-lost"
    IDLE_RELEASED = "idle-released"
    PREEMPTED = "preempted"
    RESERVED = "reserved"
    RESERVATION_ENDED = "reservation-ended"
    RESERVATION_WARNING = "reservation-warning"

    @staticmethod
    def done(action: Action) -> Kind:
        """The event of a hold, release or update of a job, or a drain, undrain, pause or unpause."""
        if not (action.on_pending or action.on_queue):
            raise ValueError(f"{action.value} is journalled by its own events, not as done")
        return Kind(action.value)

    @staticmethod
    def refused(action: Action) -> Kind:
        return Kind(f"{action.value}-refused")

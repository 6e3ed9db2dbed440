"""Who may act on a job, as clients check it before they ask: its owner, the queue's owner or an admin
(``jobs.accounts.may_act``). The daemon checks each request's file owner again; this check is there so
that a refusal is one line at once, and nothing is written.

Light: the common case, one's own job, imports nothing (the quick `gpuq suspend` takes it)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from gpuq_scheduler.jobs.store.statedir import StateDir


def may_act(state: StateDir, uid: int, owner_uid: int) -> bool:
    """Whether ``uid`` may act on a job of ``owner_uid``'s in ``state``'s queue."""
    if uid == owner_uid:
        return True  # the common case reads no config
    from gpuq_scheduler.jobs import accounts, config

    return accounts.may_act(uid, owner_uid, config.load().shared.admins, state.owner())

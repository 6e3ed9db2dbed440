"""Moving a PyTorch job's GPU memory to host memory and back at the link's speed, from inside the job.

PyTorch run with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` backs its memory with the driver's
virtual memory API: a reserved range of addresses per segment, physical pages (``cuMemCreate``) mapped into
it. ``release`` copies every mapped page to pinned host memory (chunks of 256 MiB on several streams, the host
memory pinned by several threads at once: pinning one buffer at a time runs at the driver checkpoint's own
1.5-2 GB/s, bench/results/h200-fastsuspend-2026-11-29), then unmaps and releases the pages, so the GPU
memory is free while the addresses stay reserved. ``restore`` creates pages of the same properties, maps them
at the same addresses and copies the content back: the program's pointers, a captured CUDA graph's
included, stay valid.

The mechanism is ``fastmove``; this module is the job's side of gpuq's request, and the typed facts both
ends read. Run in the job's main thread, between two of its Python steps (``install``: a signal handler), so that no
kernel of the job runs on a page while it is away. The daemon's helper (``launcher.daemon.suspension.suspender``) sends
``SUSPEND_SIGNAL`` and waits for ``<dir>/<pid>.released``; it freezes the job; at resume it thaws it, sends
``RESUME_SIGNAL`` and waits for ``<dir>/<pid>.restored``. Standard library only at import; torch and libcuda
are touched only when a request comes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pathlib
import signal
import sys
import threading
import time
from enum import Enum
from types import FrameType
from typing import Any

SUSPEND_SIGNAL = signal.SIGRTMIN + 4  # release and hold; one both ends import
RESUME_SIGNAL = signal.SIGRTMIN + 5  # restore and go on
DIR_ENV = "GPUQ_FASTSUSPEND_DIR"  # where the job says what it did (set by gpuq for a --preemptible job)


class Path(str, Enum):
    """Which way a suspend moved a job's GPU memory (``gpuq show``, the ``suspended`` event)."""

    FAST = "fast"  # the job copied its pages out itself; the driver's checkpoint took the rest (the context)
    IN_PLACE = "fast-in-place"  # the same for an MPS client, whose context stays: the driver cannot take it
    # the same for a job whose fast release left little (its context): kept on its GPU, the job frozen, no
    # driver's checkpoint to take it (seconds for under a gigabyte, launcher/daemon/suspension/suspender.py)
    CONTEXT_KEPT = "fast-context-kept"
    DRIVER = "driver"  # the driver's checkpoint took it all, as before the fast path


class Order(str, Enum):
    """What gpuq asks of the job's handler (``order.json``'s ``action``), sent with SUSPEND_SIGNAL but for
    RESUME: ``keep`` says there whether to hold the pinned host memory afterwards (a pool)."""

    SUSPEND = "suspend"  # move the memory out and hold until RESUME_SIGNAL
    RESUME = "resume"  # (with RESUME_SIGNAL) bring it back; ``keep``: hold the pinned buffers for the next suspend
    DROP = "drop"  # give the pool back: the host needs the room (the job runs on)


class Fallback(str, Enum):
    """Why a suspend took the driver's path."""

    NOT_ASKED = "not-asked"  # no process of the job answers gpuq's request (not --preemptible, not Python...)
    NOT_APPLICABLE = "not-applicable"  # the job said why it cannot (no torch, no expandable segments...)
    FAILED = "failed"  # the job tried and failed (nothing released); its sentence says how
    NO_ANSWER = "no-answer"  # the job did not answer in time (busy in one long call, say)

    def explain(self, detail: str) -> str:
        said = {
            Fallback.NOT_ASKED: "no process of the job answers the fast path's request",
            Fallback.NOT_APPLICABLE: "the fast path does not apply",
            Fallback.FAILED: "the fast path failed",
            Fallback.NO_ANSWER: "the job did not answer the fast path's request in time",
        }[self]
        return f"{said}: {detail}" if detail else said


def applicable() -> str:
    """Why this process cannot take the fast path before libcuda is opened ("" if it may): it must hold CUDA
    memory through PyTorch (or, beside the fake inventory, be a fake CUDA process that does: ``_fake``)."""
    if _fake():
        return ""
    if "torch" not in sys.modules:
        return "the process has not imported torch"
    import torch

    if not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return "the process holds no CUDA memory through PyTorch"
    return ""


def _load(name: str) -> Any:
    """``jobs/<name>.py``, the file beside this one, loaded by its path: this file itself was loaded so (gpuq's
    sitecustomize), in an interpreter that need not have gpuq installed."""
    found = sys.modules.get(f"gpuq_{name}")
    if found is None:
        spec = importlib.util.spec_from_file_location(f"gpuq_{name}", pathlib.Path(__file__).with_name(f"{name}.py"))
        if spec is None or spec.loader is None:
            raise ImportError(f"{name}.py is not beside fastsuspend.py")
        found = importlib.util.module_from_spec(spec)
        sys.modules[f"gpuq_{name}"] = found
        spec.loader.exec_module(found)
    return found


def _fake() -> bool:
    """A fake CUDA process of the fake inventory (tests) that allocates as PyTorch would: ``fastmove_fake``."""
    return bool(os.environ.get("GPUQ_FAKE_USAGE")) and bool(_load("fastmove_fake").applies())


def _mechanism() -> Any:
    """``fastmove``, loaded on the first request (``fastmove_fake`` beside the fake inventory)."""
    return _load("fastmove_fake" if _fake() else "fastmove")


def _keep_pages() -> None:
    """PyTorch keeps the handles of the pages it mapped, to release them when it gives memory back; pages
    that came back under other handles would make that release fail (and leave its allocator inconsistent:
    an illegal address seen on the H200). So this process no longer gives cached memory back: empty_cache
    does nothing. An out-of-memory retry inside PyTorch still would (docs/suspend.md)."""
    import torch

    torch.cuda.empty_cache = lambda: None
    torch.cuda.memory.empty_cache = lambda: None


def _order(where: pathlib.Path) -> dict[str, Any]:
    """gpuq's last order (``order.json``; ``Order`` names its actions): written before each signal, under a
    new ``id`` each time, so a signal delivered twice is acted on once."""
    try:
        found = json.loads((where / "order.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def pool_file(where: str | os.PathLike[str], pid: int) -> pathlib.Path:
    """Where process ``pid`` says how much pinned host memory it keeps (``{"bytes": N}``), for the daemon's
    host checks: rewritten after each restore and once a pool given back is unpinned."""
    return pathlib.Path(where) / f"{pid}.pool"


def _write(path: pathlib.Path, fact: dict[str, Any]) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    temp.write_text(json.dumps(fact))
    os.replace(temp, path)


def install(directory: str | os.PathLike[str]) -> None:
    """Answer gpuq's suspend and resume requests in this process (its main thread): on SUSPEND_SIGNAL,
    release and write ``<pid>.released`` (``ok``, ``bytes``, ``seconds``, ``steps`` or ``why``), then hold
    until RESUME_SIGNAL, restore and write ``<pid>.restored``."""
    where = pathlib.Path(directory)
    movers: list[Any] = []  # fastmove.Mover, made at the first request
    done: set[object] = set()  # the ids of the orders acted on

    def on_suspend(signum: int, frame: FrameType | None) -> None:
        pid = os.getpid()
        order = _order(where)
        action, ident = order.get("action", Order.SUSPEND.value), order.get("id")
        if (ident is not None and ident in done) or action == Order.RESUME.value:
            return  # a signal delivered twice, or one whose order was followed by the resume's: acted on
        done.add(ident)
        if action == Order.DROP.value:
            give_back(pid)
            return
        with contextlib.suppress(FileNotFoundError):
            (where / f"{pid}.restored").unlink()
        at = time.monotonic()
        why = applicable()
        if why:
            _write(where / f"{pid}.released", {"ok": False, "applies": False, "why": why})
            return
        try:
            move = _mechanism()
            if not movers:
                movers.append(move.Mover())
            try:
                moved = movers[0].release()
            except move.NotApplicable as err:
                _write(where / f"{pid}.released", {"ok": False, "applies": False, "why": str(err)})
                return
        except Exception as err:  # any failure is said, and the driver's path takes over
            _write(where / f"{pid}.released", {"ok": False, "applies": True, "why": f"{type(err).__name__}: {err}"})
            return
        took = time.monotonic() - at
        signal.pthread_sigmask(signal.SIG_BLOCK, {RESUME_SIGNAL})
        _write(where / f"{pid}.released", {"ok": True, "bytes": moved, "seconds": took, "steps": movers[0].steps})
        try:
            signal.sigwait({RESUME_SIGNAL})
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {RESUME_SIGNAL})
        at = time.monotonic()
        try:
            mover = movers[0]
            # Whether to keep the pinned memory is decided now, by the resume's order: the host's room then.
            resumed = _order(where)
            mover.keep = resumed.get("action") == Order.RESUME.value and resumed.get("keep") is True
            done.add(resumed.get("id"))
            back = mover.restore()
            took = time.monotonic() - at
            if mover.moved:
                _keep_pages()
            fact: dict[str, Any] = {
                "ok": True,
                "bytes": back,
                "seconds": took,
                "steps": mover.steps,
                "moved": mover.moved,
                "pool": mover.kept,  # pinned host memory kept for the next suspend (gpuq's host check counts it)
            }
        except Exception as err:
            _write(where / f"{pid}.restored", {"ok": False, "why": f"{type(err).__name__}: {err}"})
            os._exit(75)
        (where / f"{pid}.released").unlink(missing_ok=True)
        _write(pool_file(where, pid), {"bytes": mover.kept})
        _write(where / f"{pid}.restored", fact)

    def give_back(pid: int) -> None:
        """Unpin the pool beside the job's work (100 GiB takes seconds), then say so; the next release waits
        for it (``unpinning``). Nothing to do while memory is out: the resume's order decides then."""
        if not movers or movers[0].held is not None or not movers[0].kept:
            return
        mover = movers[0]
        pool, mover.pool = mover.pool, []

        def unpin() -> None:
            mover.unpin_all(pool)
            _write(pool_file(where, pid), {"bytes": mover.kept})

        if mover.unpinning is not None:
            mover.unpinning.join()
        mover.unpinning = threading.Thread(target=unpin)  # not a daemon thread: an exit waits for it
        mover.unpinning.start()

    def on_stray_resume(signum: int, frame: FrameType | None) -> None:
        _write(where / f"{os.getpid()}.restored", {"ok": True, "bytes": 0, "seconds": 0.0, "steps": {}})

    signal.signal(SUSPEND_SIGNAL, on_suspend)
    signal.signal(RESUME_SIGNAL, on_stray_resume)  # a resume with nothing held: said done, never fatal


def install_from_env() -> bool:
    """``install`` where gpuq asked for it (DIR_ENV set, main thread); whether it did."""
    directory = os.environ.get(DIR_ENV)
    if not directory or threading.current_thread() is not threading.main_thread():
        return False
    install(directory)
    return True

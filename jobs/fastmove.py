"""The fast suspend's mechanism (``jobs.fastsuspend`` asks it): a PyTorch process's pages, mapped through the
driver's virtual memory API (``expandable_segments:True``), copied to pinned host memory, unmapped and
released at their addresses, then created, mapped at the same addresses and copied back.

Copies of CHUNK bytes on STREAMS streams; host memory pinned by THREADS threads at once, or kept pinned
between suspends (``Mover.keep``: a pool, which makes every later suspend run at the link's speed and costs
that host memory meanwhile). Measured on a lent H200: bench/results/h200-fastsuspend-2026-11-29. Standard
library only (ctypes on libcuda); torch is imported when ``release`` runs, in a process that has it already.
Loaded by file path by the job's handler (the job's interpreter need not have gpuq installed).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

CHUNK = 256 << 20  # bytes per copy: large enough for the link's speed, small enough to pipeline with pinning
PAGE = 2 << 20  # the driver's granularity for device memory: the step of the walk over a segment
STREAMS = 4
THREADS = 12  # of the lent H200 host's 16 cores
_PROT = 0x1 | 0x2  # PROT_READ | PROT_WRITE
_POPULATE = 0x8000  # MAP_POPULATE: the pages faulted in by the thread that maps them
_MAP = 0x02 | 0x20 | _POPULATE  # MAP_PRIVATE | MAP_ANONYMOUS
_MADV_HUGEPAGE = 14
PINS = ("populate", "lazy", "thp", "hostalloc")


class NotApplicable(Exception):
    """The fast path cannot take this process (its sentence says why); the driver's checkpoint can."""


@dataclass(frozen=True)
class Piece:
    """One physical allocation mapped at ``base``: what ``restore`` creates and maps again."""

    base: int
    size: int
    prop: bytes  # CUmemAllocationProp, as the driver gave it
    device: int
    handle: int  # PyTorch's handle to it, kept by PyTorch to release it later


@dataclass
class Host:
    """One pinned host buffer (CHUNK bytes) and the device range whose content it holds."""

    address: int
    device_address: int
    size: int


@dataclass
class Held:
    """What a release took away: the pieces to map again and the host buffers with their content."""

    pieces: list[Piece] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(piece.size for piece in self.pieces)


class Driver:
    """The few libcuda calls this needs, with their types (every pointer a 64-bit integer)."""

    def __init__(self) -> None:
        cuda = ctypes.CDLL("libcuda.so.1")  # CDLL: each call lets go of the GIL, so the pinning threads overlap
        u64, sz, p, i = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
        types: dict[str, list[Any]] = {
            "cuMemRetainAllocationHandle": [ctypes.POINTER(u64), p],
            "cuMemGetAllocationPropertiesFromHandle": [p, u64],
            "cuMemCreate": [ctypes.POINTER(u64), sz, p, u64],
            "cuMemMap": [u64, sz, sz, u64, u64],
            "cuMemUnmap": [u64, sz],
            "cuMemRelease": [u64],
            "cuMemSetAccess": [u64, sz, p, sz],
            "cuMemcpyDtoHAsync_v2": [p, u64, sz, p],
            "cuMemcpyHtoDAsync_v2": [u64, p, sz, p],
            "cuStreamCreate": [ctypes.POINTER(p), ctypes.c_uint],
            "cuStreamSynchronize": [p],
            "cuStreamDestroy_v2": [p],
            "cuMemHostRegister_v2": [p, sz, ctypes.c_uint],
            "cuMemHostUnregister": [p],
            "cuMemHostAlloc": [ctypes.POINTER(p), sz, ctypes.c_uint],
            "cuMemFreeHost": [p],
            "cuCtxGetCurrent": [ctypes.POINTER(p)],
            "cuCtxSetCurrent": [p],
        }
        for name, argtypes in types.items():
            function = getattr(cuda, name)
            function.argtypes, function.restype = argtypes, i
        self._cuda = cuda

    def __call__(self, name: str, *args: Any) -> None:
        code = getattr(self._cuda, name)(*args)
        if code != 0:
            raise OSError(f"{name} failed with CUDA error {code}")

    def retain(self, address: int) -> int | None:
        handle = ctypes.c_uint64()
        code = self._cuda.cuMemRetainAllocationHandle(ctypes.byref(handle), ctypes.c_void_p(address))
        return handle.value if code == 0 else None  # not mapped here

    def context(self) -> int:
        ctx = ctypes.c_void_p()
        self("cuCtxGetCurrent", ctypes.byref(ctx))
        if not ctx.value:
            raise NotApplicable("no CUDA context is current in the job's main thread")
        return ctx.value


def pieces_of(driver: Driver, segments: list[dict[str, Any]]) -> tuple[list[Piece], dict[int, int]]:
    """Every physical allocation mapped in PyTorch's segments, found by asking the driver for the handle at
    each page (one handle spans many pages; PyTorch's own page size is not assumed), and how many
    references this walk took on each handle (to give back, with PyTorch's own, at the release)."""
    taken: dict[int, int] = {}
    pieces: list[Piece] = []
    for segment in segments:
        if not segment.get("is_expandable"):
            raise NotApplicable("PyTorch's memory is not in expandable segments (PYTORCH_CUDA_ALLOC_CONF)")
        start, end = int(segment["address"]), int(segment["address"]) + int(segment["total_size"])
        run_base, run_handle = start, None
        for address in range(start, end + PAGE, PAGE):
            handle = driver.retain(address) if address < end else None
            if handle is not None:
                taken[handle] = taken.get(handle, 0) + 1
            if handle != run_handle or handle is None:
                if run_handle is not None:
                    prop = ctypes.create_string_buffer(64)
                    driver("cuMemGetAllocationPropertiesFromHandle", prop, run_handle)
                    device = int.from_bytes(prop.raw[12:16], "little")  # CUmemLocation.id
                    pieces.append(Piece(run_base, address - run_base, prop.raw, device, run_handle))
                run_base, run_handle = address, handle
    return pieces, taken


def _ranges(pieces: list[Piece]) -> list[tuple[int, int]]:
    """The pieces as copies of at most CHUNK bytes (contiguous pieces copied across their boundaries)."""
    out: list[tuple[int, int]] = []
    for piece in pieces:
        at = piece.base
        if out and out[-1][0] + out[-1][1] == at and out[-1][1] < CHUNK:
            take = min(CHUNK - out[-1][1], piece.size)
            out[-1] = (out[-1][0], out[-1][1] + take)
            at += take
        while at < piece.base + piece.size:
            take = min(CHUNK, piece.base + piece.size - at)
            out.append((at, take))
            at += take
    return out


class Mover:
    """Releases and restores this process's PyTorch memory; keeps host buffers pinned between suspends when
    asked (``keep``: the first suspend pins, later ones copy at the link's speed; costs the host memory)."""

    # thp by default: 4.9 GB/s pinning afresh on the lent H200, against 2.9-3.0 (populate), 2.9 (lazy) and 2.1
    # (hostalloc) (bench/results/h200-fastsuspend-2026-11-29b): a fault per 2 MiB rather than per 4 KiB.
    def __init__(self, keep: bool = False, threads: int = THREADS, pin: str = "thp") -> None:
        self.driver = Driver()
        # libc's mmap through ctypes, not Python's: its call lets go of the GIL, so the threads fault pages
        # in at once (Python's mmap module held it: 2.6 GB/s on the H200, pinning included).
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mmap.restype = ctypes.c_void_p
        libc.munmap.argtypes, libc.munmap.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int
        libc.madvise.argtypes, libc.madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
        self.libc = libc
        if pin not in PINS:
            raise ValueError(f"pin must be one of {', '.join(PINS)}")
        self.keep, self.threads, self.pin = keep, threads, pin
        self.moved = 0  # pieces that came back under another handle than PyTorch's (see ``restore``)
        self.unpinning: threading.Thread | None = None
        self.pool: list[Host] = []  # pinned buffers of CHUNK bytes, free
        self.held: Held | None = None
        self.steps: dict[str, float] = {}
        self.ctx = 0  # the job's context, made current in a thread that unpins (the driver's calls need one)

    @property
    def kept(self) -> int:
        """Bytes of pinned host memory kept for the next suspend (the pool)."""
        return len(self.pool) * CHUNK

    def _streams(self) -> list[ctypes.c_void_p]:
        streams = []
        for _ in range(STREAMS):
            stream = ctypes.c_void_p()
            self.driver("cuStreamCreate", ctypes.byref(stream), 1)  # CU_STREAM_NON_BLOCKING
            streams.append(stream)
        return streams

    def _done(self, streams: list[ctypes.c_void_p]) -> None:
        for stream in streams:
            self.driver("cuStreamSynchronize", stream)
            self.driver("cuStreamDestroy_v2", stream)

    def _pin(self, ctx: int) -> Host:
        """One pinned buffer of CHUNK bytes, by ``self.pin``'s way (each measured: bench/pin_probe.py):
        ``populate``, the pages faulted in by mmap itself, then registered; ``lazy``, registered unfaulted (the
        driver's pinning faults them in); ``thp``, the same as transparent huge pages (a fault per 2 MiB);
        ``hostalloc``, the driver's own allocation (cuMemHostAlloc)."""
        self.driver("cuCtxSetCurrent", ctypes.c_void_p(ctx))
        if self.pin == "hostalloc":
            found = ctypes.c_void_p()
            self.driver("cuMemHostAlloc", ctypes.byref(found), CHUNK, 0)
            return Host(int(found.value or 0), 0, 0)
        flags = _MAP if self.pin == "populate" else _MAP & ~_POPULATE
        address = self.libc.mmap(None, CHUNK, _PROT, flags, -1, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of pinned host memory failed")
        if self.pin == "thp":
            self.libc.madvise(ctypes.c_void_p(address), CHUNK, _MADV_HUGEPAGE)  # a hint: refused, 4 KiB pages
        try:
            self.driver("cuMemHostRegister_v2", ctypes.c_void_p(address), CHUNK, 0)
        except OSError:
            self.libc.munmap(ctypes.c_void_p(address), CHUNK)
            raise
        return Host(address, 0, 0)

    def _unpin(self, host: Host) -> None:
        if self.pin == "hostalloc":
            with contextlib.suppress(OSError):
                self.driver("cuMemFreeHost", ctypes.c_void_p(host.address))
            return
        with contextlib.suppress(OSError):
            self.driver("cuMemHostUnregister", ctypes.c_void_p(host.address))
        self.libc.munmap(ctypes.c_void_p(host.address), CHUNK)

    def release(self) -> int:
        """Copy out, unmap and release every page of PyTorch's memory; the bytes moved. NotApplicable when
        this process cannot take the fast path (nothing changed then)."""
        import torch

        if self.held is not None:
            return self.held.bytes  # released already (a second request)
        if self.unpinning is not None:
            self.unpinning.join()
        steps, at = self.steps, time.monotonic()
        steps.clear()
        torch.cuda.synchronize()
        segments: list[dict[str, Any]] = torch.cuda.memory_snapshot()  # type: ignore[no-untyped-call]
        ctx = self.ctx = self.driver.context()
        pieces, taken = pieces_of(self.driver, segments)
        steps["walk"] = time.monotonic() - at
        held = Held(pieces)
        fresh: list[Future[Host]] = []
        try:
            at = time.monotonic()
            ranges = _ranges(pieces)
            streams = self._streams()
            with ThreadPoolExecutor(self.threads) as pool:
                fresh = [pool.submit(self._pin, ctx) for _ in range(max(0, len(ranges) - len(self.pool)))]
                for index, (address, size) in enumerate(ranges):
                    # the first pinned first: copies follow the pinning rather than wait for all of it
                    host = self.pool.pop() if self.pool else fresh.pop(0).result()
                    host.device_address, host.size = address, size
                    held.hosts.append(host)
                    self.driver(
                        "cuMemcpyDtoHAsync_v2", ctypes.c_void_p(host.address), address, size, streams[index % STREAMS]
                    )
            self._done(streams)
            steps["copy_out"] = time.monotonic() - at
        except BaseException:
            held.hosts += [future.result() for future in fresh if future.exception() is None]
            for handle, count in taken.items():
                for _ in range(count):
                    self.driver("cuMemRelease", handle)
            for host in held.hosts:
                self._unpin(host)
            raise
        at = time.monotonic()
        for piece in pieces:
            self.driver("cuMemUnmap", piece.base, piece.size)
        for handle, count in taken.items():
            for _ in range(count + 1):  # the walk's references, then PyTorch's own: the pages are freed
                self.driver("cuMemRelease", handle)
        steps["unmap"] = time.monotonic() - at
        self.held = held
        return held.bytes

    def restore(self) -> int:
        """Map pages of the same properties at the same addresses and copy the content back; the bytes."""
        held = self.held
        if held is None:
            return 0
        if self.unpinning is not None:
            self.unpinning.join()
        steps, at = self.steps, time.monotonic()
        access = (ctypes.c_int * 3)()
        self.moved = 0
        # Created in the reverse order of their release, which is where a driver that hands out freed handles
        # again, last in first out, would give each piece PyTorch's own handle back (counted: ``moved``).
        for piece in reversed(held.pieces):
            handle = ctypes.c_uint64()
            self.driver("cuMemCreate", ctypes.byref(handle), piece.size, piece.prop, 0)
            self.driver("cuMemMap", piece.base, piece.size, 0, handle.value, 0)
            access[0], access[1], access[2] = 1, piece.device, 3  # CU_MEM_LOCATION_TYPE_DEVICE, id, READWRITE
            self.driver("cuMemSetAccess", piece.base, piece.size, access, 1)
            self.moved += handle.value != piece.handle
        steps["map"] = time.monotonic() - at
        at = time.monotonic()
        streams = self._streams()
        for index, host in enumerate(held.hosts):
            self.driver(
                "cuMemcpyHtoDAsync_v2",
                host.device_address,
                ctypes.c_void_p(host.address),
                host.size,
                streams[index % STREAMS],
            )
        self._done(streams)
        steps["copy_in"] = time.monotonic() - at
        self.held = None
        if self.keep:
            self.pool.extend(held.hosts)
        else:  # given back while the job goes on: unpinning 18 GB took 0.9 s
            # (not a daemon thread: an exit meanwhile waits for it rather than tearing the pool down under it)
            spare, self.pool = self.pool, []  # a pool larger than this copy needed: none kept either
            self.unpinning = threading.Thread(target=self.unpin_all, args=(held.hosts + spare,))
            self.unpinning.start()
        return held.bytes

    def unpin_all(self, hosts: list[Host]) -> None:
        """Give back these pinned buffers (no longer in the pool), from any thread."""
        if self.ctx:
            with contextlib.suppress(OSError):
                self.driver("cuCtxSetCurrent", ctypes.c_void_p(self.ctx))
        for host in hosts:
            self._unpin(host)
        hosts.clear()

    def drop(self) -> None:
        """Give back the pinned buffers kept for later suspends."""
        pool, self.pool = self.pool, []
        for host in pool:
            self._unpin(host)

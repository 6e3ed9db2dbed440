"""`gpuq serve`: a small read-only web dashboard for the team, the same picture as JSON, and Prometheus metrics.

    /            GPUs (memory by holder, utilisation, fence), running and waiting jobs, GPU-hours by user
                 and a per-GPU timeline of the last hours; it reloads itself every 5 s (no script, nothing
                 fetched, and a Content-Security-Policy that would refuse either)
    /api/gpus    per GPU, as JSON
    /api/jobs    running and waiting jobs, as JSON (a running job with its GPU-hours, GPU energy, host CPU
                 time and peak host memory so far)
    /metrics     Prometheus' text format (``metrics.py``)

It shows only what every user of a shared queue may see (``gpuq status``'s public columns): never a
command line, a working directory, an environment or a log. It binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuq_scheduler.jobs.errors import GpuqError
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.units import format_duration, format_size
from gpuq_scheduler.launcher.gpus import holders
from gpuq_scheduler.launcher.gpus.snapshot import GpuSource
from gpuq_scheduler.launcher.views import live, report_html
from gpuq_scheduler.launcher.views import reservation_lines as reserved
from gpuq_scheduler.launcher.views.report import build_report
from gpuq_scheduler.launcher.views.report_html import html_table
from gpuq_scheduler.launcher.views.report_text import hours_text, when

TIMELINE_HOURS = 6.0
GPU_COLUMNS = ("GPU", "NAME", "MEMORY", "JOBS USE", "RESERVED", "OUTSIDE", "TOTAL", "UTIL", "FENCE", "STATE")
_CSS = """
body{font:14px/1.4 "DejaVu Sans",Arial,sans-serif;margin:20px;color:#212121}h1{font-size:20px;margin:0 0 4px}
h2{font-size:16px;margin:20px 0 6px}table{border-collapse:collapse}th,td{padding:3px 10px;text-align:left;
border-bottom:1px solid #eee}th{background:#fafafa}.bar{display:flex;width:240px;height:14px;border:1px solid #bbb}
.jobs{background:#1565c0}.reserved{background:#90caf9}.outside{background:#ef6c00}.note{color:#616161}
.empty{color:#616161}.legend span{margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}
"""


class Dashboard:
    """The queue and the GPUs, read once per request (one request at a time reads the GPUs)."""

    def __init__(self, queue: Queue, source: GpuSource) -> None:
        self.queue, self.source = queue, source
        self.lock = threading.Lock()

    def picture(self) -> live.Picture:
        """The box now, its running jobs with the host CPU time and peak memory their cgroups accounted so far."""
        with self.lock:
            picture = live.take(self.queue, self.source)
        running = [live.with_host_usage(self.queue.state, r) for r in picture.running]
        return dataclasses.replace(picture, running=running)

    def away(self, records: list[JobRecord], now: float) -> dict[int, list[tuple[float, float]]]:
        """Each job's time suspended, for the timeline (nothing where the journal cannot be read: a shared
        queue's is root's)."""
        from gpuq_scheduler.jobs.store import journal
        from gpuq_scheduler.jobs.store.events import Event, Kind
        from gpuq_scheduler.launcher.views import suspend_costs

        events: list[Event]
        try:
            events = list(journal.read(self.queue.state.events, (Kind.SUSPENDED, Kind.RESUMED)))
        except OSError:
            events = []
        return suspend_costs.away(events, records, now)

    def gpus(self, picture: live.Picture) -> list[dict[str, Any]]:
        return [
            {
                **line.row.to_json(),
                "used_by_gpuq_jobs": line.jobs_use,
                "utilization": line.utilization,
                "drained": line.drained,
            }
            for line in picture.gpus
        ]

    def jobs(self, picture: live.Picture) -> dict[str, list[dict[str, Any]]]:
        return {
            "running": [
                {
                    **_public(r, picture.job_use.get(r.id)),
                    "utilization": picture.job_util.get(r.id),
                    "gpu_hours": r.gpu_hours(picture.taken),
                    "gpu_energy_j": r.energy,
                    "cpu_seconds": r.cpu_seconds,
                    "peak_ram": r.peak_ram,
                }
                for r in picture.running
            ],
            "waiting": [_public(r, None) for r in picture.waiting],
        }

    def page(self, picture: live.Picture) -> str:
        e = html.escape
        now = picture.taken
        records = self.queue.records()
        report = build_report(records, len(picture.gpus), now=now, since=TIMELINE_HOURS * 3600)
        gpus = [
            (
                f"GPU {g.row.index}",
                g.row.name,
                _bar(g),
                format_size(g.jobs_use),
                format_size(g.row.reserved),
                format_size(g.row.external),
                format_size(g.row.total),
                "-" if g.utilization is None else f"{g.utilization}%",
                g.row.fence,
                "LOST" if g.row.state != "ok" else ("drained" if g.drained else "ok"),
            )
            for g in picture.gpus
        ]
        users = [(user, hours_text(h)) for user, h in report.gpu_hours_by_user.items()]
        reservations = reserved.current(self.queue.state, now)
        booked = [(g, r.start, r.end, "reserved: " + reserved.words(r, now)) for r in reservations for g in r.gpus]
        # The axis starts when the first job of the window was queued: say the span it shows, not the window.
        shown = f"last {format_duration(now - report.timeline_start)}, since {when(report.timeline_start, '%H:%M')}"
        return "\n".join(
            [
                "<!DOCTYPE html>",
                '<html lang="en"><head><meta charset="utf-8">',
                f'<meta http-equiv="Content-Security-Policy" content="{report_html._CSP}">',
                '<meta http-equiv="refresh" content="5">',
                f"<title>gpuq: {e(str(self.queue.state.root))}</title><style>{_CSS}</style></head><body>",
                f'<h1>gpuq</h1><p class="note" id="taken">{e(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)))}'
                f" &middot; {len(picture.running)} running &middot; {len(picture.waiting)} waiting"
                f"{' &middot; queue PAUSED' if picture.paused else ''}</p>",
                "<h2>GPUs</h2>",
                html_table("gpus", GPU_COLUMNS, gpus, markup_column=2),
                '<p class="note"><span class="jobs">&nbsp;&nbsp;</span> used by gpuq jobs &nbsp;'
                '<span class="reserved">&nbsp;&nbsp;</span> reserved, not used &nbsp;'
                '<span class="outside">&nbsp;&nbsp;</span> outside gpuq</p>',
                *(f'<p class="note outside-holders">{e(line)}</p>' for line in holders.lines(picture.outside)),
                # The timeline next, above the fold of a laptop's screen; the tables of jobs under it.
                f"<h2>Timeline, {e(shown)}</h2>",
                report_html.timeline_svg(report, self.away(records, now), booked),
                report_html.legend_html(),
                *(
                    [
                        f'<p class="note" id="reservations">{e(reserved.status_line(self.queue.state, now) or "")} '
                        "(outlined on the timeline)</p>"
                    ]
                    if reservations
                    else []
                ),
                "<h2>Running</h2>",
                html_table("running", live.RUNNING_COLUMNS, live.running_rows(picture)),
                "<h2>Waiting</h2>",
                html_table("waiting", live.WAITING_COLUMNS, live.waiting_rows(picture)),
                f"<h2>GPU-hours by user, last {TIMELINE_HOURS:g} h</h2>",
                html_table("users", ("USER", "GPU-HOURS"), users),
                "</body></html>",
            ]
        )


def _public(record: JobRecord, uses: int | None) -> dict[str, Any]:
    """A job as every user may see it: no command, cwd, environment or log."""
    return {
        "id": record.id,
        "name": record.spec.display_name,
        "user": record.user,
        "state": record.state.value,
        "gpus_requested": record.spec.gpus,
        "gpus": list(record.gpus),
        "mem_per_gpu": record.spec.mem_per_gpu,
        "mem_auto": record.spec.mem_auto,
        "uses": uses,
        "submitted_at": record.submitted_at,
        "started_at": record.started_at,
        "time_limit": record.spec.time_limit,
        "reason": record.reason,
        "array_id": record.array_id,
        "held": record.held,
    }


def _bar(line: live.GpuLine) -> str:
    total, parts = max(line.row.total, 1), line.holders()
    cells = "".join(
        f'<span class="{name}" style="width:{100 * parts[name] / total:.1f}%"></span>'
        for name in ("jobs", "reserved", "outside")
    )
    return f'<div class="bar" data-gpu="{line.row.index}">{cells}</div>'


def handler(dashboard: Dashboard, metrics: Callable[[], bytes]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuq"
        timeout = CLIENT_TIMEOUT  # the socket's: a client that says nothing is dropped, not waited on for ever

        def setup(self) -> None:
            super().setup()
            # The socket's timeout is per read: a client trickling a byte at a time would keep its thread for
            # ever. Its request line and headers get one deadline in all, then the connection is shut.
            self._deadline = threading.Timer(HEADERS_DEADLINE, _shut, (self.connection,))
            self._deadline.daemon = True
            self._deadline.start()

        def parse_request(self) -> bool:
            parsed = super().parse_request()  # reads the headers
            self._deadline.cancel()
            return parsed

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def do_GET(self) -> None:
            try:
                self._get(self.path.split("?", 1)[0])
            except GpuqError as err:  # a damaged or unreadable state directory: say so, keep serving
                self._send(503, "text/plain; charset=utf-8", f"gpuq: {err}\n".encode())

        def do_HEAD(self) -> None:
            """What GET would answer, headers only (monitoring probes and `curl -I` ask this way)."""
            self.do_GET()

        def _get(self, path: str) -> None:
            if path == "/metrics":
                self._send(200, "text/plain; version=0.0.4; charset=utf-8", metrics())
                return
            if path not in ("/", "/api/gpus", "/api/jobs"):
                self._send(404, "text/plain; charset=utf-8", b"not found: try /, /api/gpus, /api/jobs or /metrics\n")
                return
            picture = dashboard.picture()
            if path == "/":
                self._send(200, "text/html; charset=utf-8", dashboard.page(picture).encode())
                return
            data = dashboard.gpus(picture) if path == "/api/gpus" else dashboard.jobs(picture)
            self._send(200, "application/json", (json.dumps(data, indent=1) + "\n").encode())

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: a dashboard polled every few seconds would fill the terminal."""

    return Handler


WORKERS = 32  # connections answered at once; one more is closed at once, so nobody can take every thread
PER_CLIENT = 8  # connections one address may hold at once: one client cannot take every worker
CLIENT_TIMEOUT = 5.0  # seconds a client may take for one read or write
HEADERS_DEADLINE = 10.0  # seconds a client may take to send its whole request line and headers


def _shut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: the request ended meanwhile
        connection.shutdown(socket.SHUT_RDWR)


class BoundedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most ``WORKERS`` connections in hand, each with a socket timeout: idle or
    slow clients (a thousand open sockets that say nothing) cost a bounded number of threads and
    descriptors, and are dropped after ``CLIENT_TIMEOUT``, where a thread each without a timeout once kept
    every one of them until the process ran out of descriptors and stopped answering. One address holds at
    most ``PER_CLIENT`` of them and each request has ``HEADERS_DEADLINE`` to be sent: a client holding 32
    half-sent requests once locked every other client out."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(WORKERS)
        self.held: dict[str, int] = {}  # per client address, the connections in hand
        self.held_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take(client_address[0]):
            self.shutdown_request(request)  # busy: the client sees a closed connection and may retry
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(client_address[0])
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(client_address[0])

    def _take(self, address: str) -> bool:
        with self.held_lock:
            if self.held.get(address, 0) >= PER_CLIENT or not self.slots.acquire(blocking=False):
                return False
            self.held[address] = self.held.get(address, 0) + 1
            return True

    def _give_back(self, address: str) -> None:
        with self.held_lock:
            self.held[address] -= 1
            if not self.held[address]:
                del self.held[address]
            self.slots.release()


def serve(queue: Queue, source: GpuSource, host: str, port: int, ready: Callable[[str], None]) -> None:
    """Serve until interrupted; ``ready`` gets the address once the socket listens."""
    from gpuq_scheduler.launcher.views import metrics, suspend_costs

    dashboard = Dashboard(queue, source)
    answer_metrics = metrics.exposition(
        dashboard.picture, dashboard.queue.records, lambda: suspend_costs.read(queue.state.events)
    )
    server = BoundedServer((host, port), handler(dashboard, answer_metrics))
    name, bound = str(server.server_address[0]), server.server_address[1]
    ready(f"http://{'[' + name + ']' if ':' in name else name}:{bound}/")
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a foreground dashboard is stopped
            server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()

"""`gpuq serve` under clients that hold its connections: idle ones, and one address trickling half-sent
requests down many. Each must leave the dashboard answering everyone else."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.error
from pathlib import Path

import psutil

from tests.conftest import Gpuq, wait_for
from tests.test_serve import Served


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_idle_connections_cannot_take_every_thread_of_the_dashboard(gpuq: Gpuq) -> None:
    """200 connections to 127.0.0.1 that never send a request: the dashboard once kept a thread for each, with
    no timeout, until it ran out of descriptors and stopped answering anyone."""
    served = Served(gpuq)
    host, port = served.url.split("//")[1].rstrip("/").split(":")
    idle = []
    try:
        for _ in range(200):
            idle.append(socket.create_connection((host, int(port)), timeout=10))
        wait_for(lambda: _threads(served.process.pid) <= 40, 30, "the server to hold a bounded number of threads")
        peak = max(_threads(served.process.pid) for _ in range(20))
        assert peak <= 40, peak

        def answered() -> bool:
            try:
                return served.get("/api/gpus")[0] == 200
            except (ConnectionError, urllib.error.URLError):
                return False  # closed at once while every worker is busy: a client retries

        wait_for(answered, 60, "an answer while the idle connections are still open")
    finally:
        for connection in idle:
            connection.close()
        served.close()


def test_a_client_holding_half_sent_requests_locks_nobody_out(gpuq: Gpuq) -> None:
    """One client (127.0.0.2) opens 40 connections and trickles half a request line down each, a byte at a
    time: the dashboard once gave it every worker, and every other client got a closed connection. Now one
    address holds a few workers at most, and a request's headers have a deadline that shuts the rest."""
    served = Served(gpuq)
    host, port = served.url.split("//")[1].rstrip("/").split(":")
    slow: list[socket.socket] = []
    stop = threading.Event()

    def trickle() -> None:  # a byte now and then, well within the server's per-read timeout
        while not stop.wait(0.5):
            for connection in slow:
                with contextlib.suppress(OSError):
                    connection.send(b"T")

    def closed(connection: socket.socket) -> bool:
        try:
            return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def held_by_server() -> int:
        return sum(
            1
            for c in psutil.Process(served.process.pid).net_connections("tcp")
            if c.raddr and c.raddr.ip == "127.0.0.2" and c.status == psutil.CONN_ESTABLISHED
        )

    pump = threading.Thread(target=trickle, daemon=True)
    try:
        for _ in range(40):
            connection = socket.create_connection((host, int(port)), timeout=10, source_address=("127.0.0.2", 0))
            connection.sendall(b"GET /api/jobs HT")
            connection.setblocking(False)  # a peek must not wait on a socket's timeout
            slow.append(connection)
        pump.start()
        # Every one of them taken in hand by the server (held by a worker, or closed), before anyone else asks.
        wait_for(lambda: held_by_server() + sum(map(closed, slow)) == len(slow), 60, "the server to take them all")
        status, _ = served.get("/api/gpus")
        assert status == 200
        wait_for(lambda: all(map(closed, slow)), 120, "the headers' deadline to shut the trickling connections")
    finally:
        stop.set()
        for connection in slow:
            connection.close()
        served.close()

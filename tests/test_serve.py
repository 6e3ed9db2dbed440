"""`gpuq serve` against a real daemon on fake GPUs: the JSON, the Prometheus text (read with
prometheus-client's own parser and checked against the queue), and the page in headless Chromium."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import THREE_GPUS, Gpuq, fake_cuda_queue, wait_for
from tests.test_report_browser import CHROMIUM, chromium, measure, near, read_png

SECRET = "SECRET-7f3a"  # in a job's command line and environment: it must never be served
JOBS_BLUE, OUTSIDE_ORANGE = (0x15, 0x65, 0xC0), (0xEF, 0x6C, 0x00)  # views/serve.py's bar colours


class Served:
    def __init__(self, gpuq: Gpuq, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpuq_scheduler", "serve", "--port", "0", *args],
            env=gpuq.env,
            cwd=gpuq.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("serving http://127.0.0.1:"), line + self.process.stderr.read()  # type: ignore[union-attr]
        self.url = line.split()[1]

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path.lstrip("/"), timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, body
        return json.loads(body)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, body = self.get("/metrics")
        assert status == 200, body
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
        }

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Gpuq, Served, dict[str, int]]]:
    teammate = [{**THREE_GPUS[0], "used": "20GiB"}, *THREE_GPUS[1:]]  # 20 GiB outside gpuq on GPU 0
    gpuq = fake_cuda_queue(tmp_path, teammate)
    jobs = {
        "packed": gpuq.submit(
            "--mem", "8G", "--name", "packed", "--env", f"TOKEN={SECRET}", "fake_cuda.py", "3", "99", "--busy", "60"
        ),
        "big": gpuq.submit("--gpus", "2", "--name", "big", "sh", "-c", f"echo {SECRET}; sleep 300"),
        "done": gpuq.submit("--gpus", "0", "--name", "quick", "true"),
    }
    gpuq.wait_state(jobs["packed"], "running")
    gpuq.wait_state(jobs["done"], "succeeded")
    server = Served(gpuq)
    yield gpuq, server, jobs
    server.close()
    gpuq.cleanup()


def test_the_json_api_shows_gpus_and_jobs_and_never_a_command(served: tuple[Gpuq, Served, dict[str, int]]) -> None:
    gpuq, server, jobs = served
    gpus = wait_for(lambda: (g := server.json("/api/gpus")) and any(x["used_by_gpuq_jobs"] for x in g) and g, 20)
    assert [g["utilization"] for g in gpus] == [35, 80, None] and [g["state"][:4] for g in gpus] == ["ok", "ok", "lost"]
    placed = gpuq.job(jobs["packed"])["gpus"][0]
    assert gpus[placed]["used_by_gpuq_jobs"] == int(3.5 * (1 << 30)) and gpus[0]["used_outside_gpuq"] == 20 << 30
    listed = server.json("/api/jobs")
    assert [j["id"] for j in listed["running"]] == [jobs["packed"]]
    assert [(j["id"], j["name"], j["reason"][:20]) for j in listed["waiting"]] == [
        (jobs["big"], "big", "waiting for 2 GPUs t")
    ]
    assert listed["running"][0]["uses"] == int(3.5 * (1 << 30)) and "command" not in listed["running"][0]
    assert listed["running"][0]["utilization"] == 60  # its processes' share of the GPU, as NVML would say
    for path in ("/", "/api/gpus", "/api/jobs", "/metrics"):
        status, body = server.get(path)
        assert status == 200 and SECRET not in body and str(gpuq.cwd) not in body, path
    assert server.get("/nothing-here")[0] == 404


def test_metrics_follow_the_queue_by_prometheus_conventions(served: tuple[Gpuq, Served, dict[str, int]]) -> None:
    gpuq, server, jobs = served
    me = gpuq.job(jobs["packed"])["user"]
    found = server.metrics()
    assert found[("gpuq_jobs", (("state", "running"), ("user", me)))] == 1
    assert found[("gpuq_jobs", (("state", "pending"), ("user", me)))] == 1
    assert found[("gpuq_jobs_started_total", ())] == 2  # packed and quick
    assert found[("gpuq_jobs_ended_total", (("outcome", "succeeded"),))] == 1
    assert found[("gpuq_queue_wait_seconds_count", ())] == 2 and found[("gpuq_queue_wait_seconds_sum", ())] >= 0
    assert found[("gpuq_queue_wait_seconds_bucket", (("le", "+Inf"),))] == 2
    gpu0 = (("gpu", "0"), ("uuid", "GPU-fake-0000"))
    assert found[("gpuq_gpu_memory_total_bytes", gpu0)] == 80 << 30
    assert found[("gpuq_gpu_memory_bytes", (*gpu0[:1], ("holder", "outside"), gpu0[1]))] == 20 << 30
    assert found[("gpuq_gpu_utilization_ratio", gpu0)] == 0.35
    assert found[("gpuq_gpu_up", (("gpu", "2"), ("uuid", "GPU-fake-0002")))] == 0
    gpuq.run("cancel", str(jobs["packed"]))
    gpuq.wait_state(jobs["packed"], "cancelled")
    after = server.metrics()
    assert after[("gpuq_jobs_ended_total", (("outcome", "cancelled"),))] == 1
    assert ("gpuq_jobs", (("state", "running"), ("user", me))) not in after


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="needs Debian's chromium (CI installs it)")
def test_the_dashboard_in_headless_chromium_shows_the_gpus_and_jobs(
    served: tuple[Gpuq, Served, dict[str, int]], tmp_path: Path
) -> None:
    _, server, jobs = served
    wait_for(lambda: any(g["used_by_gpuq_jobs"] for g in server.json("/api/gpus")), 20, "the job's memory sampled")
    dom = chromium(tmp_path, "--dump-dom", server.url).stdout
    assert dom.count('<div class="bar" data-gpu=') == 3 and "LOST" in dom
    assert f"<td>{jobs['packed']}</td>" in dom and "<td>packed</td>" in dom and "<td>big</td>" in dom
    assert 'id="timeline"' in dom and SECRET not in dom
    shot = tmp_path / "dashboard.png"
    chromium(tmp_path, f"--screenshot={shot}", server.url)
    _, _, pixels = read_png(shot)
    assert any(near(p, JOBS_BLUE) for p in pixels) and any(near(p, OUTSIDE_ORANGE) for p in pixels)


def test_head_answers_like_get_without_a_body(served: tuple[Gpuq, Served, dict[str, int]]) -> None:
    """`HEAD /` answered 501: monitoring probes and `curl -I` ask with HEAD."""
    _, server, _ = served
    address = urllib.parse.urlsplit(server.url)
    for path in ("/", "/api/gpus", "/api/jobs", "/metrics", "/nothing-here"):
        connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=30)
        connection.request("HEAD", path)
        answer = connection.getresponse()
        body = answer.read()
        connection.close()
        get_status = server.get(path)[0]
        assert (answer.status, body) == (get_status, b""), path
        assert int(answer.headers["Content-Length"]) > 0 and answer.headers["Content-Type"], path


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="needs Debian's chromium (CI installs it)")
def test_the_dashboard_timeline_shows_packed_jobs_apart_on_light_lanes(tmp_path: Path) -> None:
    """The timeline's lanes were drawn black (the dashboard had no style for them) and two jobs packed on one
    GPU were drawn on top of each other (one hidden). Checked in the screenshot's pixels, as a person sees it."""
    gpus = [
        {"name": "NVIDIA H100 80GB HBM3", "total": "80GiB", "used": "20GiB", "util": 35},  # a teammate's 20 GiB
        {"name": "NVIDIA H100 80GB HBM3", "total": "80GiB", "util": 80},
        {"name": "NVIDIA H100 80GB HBM3", "total": "80GiB", "util": 90},
    ]
    gpuq = fake_cuda_queue(tmp_path, gpus)
    try:
        # GPU 0 has outside use, so whole-GPU jobs go to GPUs 1 and 2 and both --mem jobs pack onto GPU 0.
        warmup = gpuq.submit("--gpus", "1", "--name", "warmup", "sleep", "3")
        failed = gpuq.submit("--gpus", "1", "--name", "diverged", "sh", "-c", "sleep 2; exit 3")
        packed = [
            gpuq.submit("--mem", "8G", "--name", f"seed {n}", "fake_cuda.py", str(2 + n), "300", "--busy", "40")
            for n in (1, 2)
        ]
        pretrain = gpuq.submit("--gpus", "2", "--name", "pretrain", "sleep", "300")
        gpuq.submit("--gpus", "2", "--name", "eval", "sleep", "300")  # waits behind pretrain
        for job in packed:
            assert gpuq.wait_state(job, "running")["gpus"] == [0]
        gpuq.wait_state(warmup, "succeeded")
        gpuq.wait_state(failed, "failed")
        gpuq.wait_state(pretrain, "running")
        server = Served(gpuq)
        try:
            wait_for(lambda: server.json("/api/gpus")[0]["used_by_gpuq_jobs"], 20, "the packed jobs' memory sampled")
            started = gpuq.job(pretrain)["started_at"]
            wait_for(lambda: time.time() - started > 2, 10, "pretrain's bar to grow")  # a picture worth keeping
            size = (1280, 1000)
            shot = tmp_path / "dashboard.png"
            chromium(tmp_path, f"--screenshot={shot}", server.url, size=size)
            status, page = server.get("/")
            assert status == 200
        finally:
            server.close()
    finally:
        gpuq.cleanup()
    if os.environ.get("GPUQ_SCREENSHOT_DIR"):
        keep = Path(os.environ["GPUQ_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / "gpuq-serve.png")
    layout = measure(tmp_path, page)
    width, height, pixels = read_png(shot)
    assert (width, height) == size

    def pixel(x: float, y: float) -> tuple[int, ...]:
        return pixels[int(y) * width + int(x)]

    left, top, svg_w, svg_h = layout["svg"]
    assert top + svg_h <= height, "the timeline is below the screenshot"
    # The lanes: light grey where no bar is, never black, anywhere in the timeline.
    timeline = [
        pixel(x, y)
        for y in range(int(top) + 1, int(top + svg_h) - 1)
        for x in range(int(left) + 1, int(left + svg_w) - 1)
    ]
    assert not [p for p in timeline if max(p) < 40], "the timeline has black in it"
    assert sum(near(p, (0xF5, 0xF5, 0xF5)) for p in timeline) > 2000, "no light lane background"
    # The two packed jobs: each bar in a row of its own within GPU 0's lane, and blue where it is drawn.
    bars = {int(job): box for job, gpu, box in layout["jobs"] if int(job) in packed}
    assert sorted(bars) == sorted(packed)
    (_, ya, _, ha), (_, yb, _, hb) = bars[packed[0]], bars[packed[1]]
    assert ya + ha <= yb or yb + hb <= ya, "the packed jobs' bars overlap: one hides the other"
    lane = dict(layout["lanes"])["GPU 0"]
    for job, (x, y, w, h) in bars.items():
        assert lane[1] <= y and y + h <= lane[1] + lane[3]
        inside = [pixel(px, py) for py in range(int(y) + 3, int(y + h) - 3) for px in range(int(x) + 3, int(x + w) - 3)]
        blue = sum(near(p, JOBS_BLUE) for p in inside)
        assert blue > 0.8 * len(inside), f"job {job}'s bar is not visible as its own blue bar"


def test_a_port_in_use_is_one_line_and_exit_code_2(gpuq: Gpuq) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = gpuq.run("serve", "--port", str(port), check=False, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"gpuq: cannot listen on 127.0.0.1:{port}: Address already in use; pick another --port or --host"
    )


SUSPENDED_AMBER, CANCELLED_GREY, FAILED_RED = (0xF9, 0xA8, 0x25), (0x75, 0x75, 0x75), (0xC6, 0x28, 0x28)


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"), reason="needs Debian's chromium (CI installs it)")
def test_the_dashboard_at_1400x900_shows_the_timeline_its_legend_failures_and_time_suspended(tmp_path: Path) -> None:
    """Issue #39, friction 10, as a person sees it in a 1400x900 window: the timeline was below the fold, had
    no legend, drew a failed and a cancelled job as unlabelled slivers, said "last 6 h" over an axis of a
    few minutes, and did not mark the time a job spent suspended."""
    import re  # here, and FIXTURES: this module's imports are shared with other work on it

    from tests.conftest import FIXTURES

    gpuq = fake_cuda_queue(tmp_path, "4x80GiB", GPUQ_FAKE_HOST_MEMORY="256GiB")
    shutil.copy(FIXTURES / "fake_counter.py", gpuq.cwd / "fake_counter.py")
    try:
        long = gpuq.submit("--gpus", "1", "--name", "pretrain", "sleep", "300")
        counter = gpuq.submit("--gpus", "1", "--name", "sweep", "fake_counter.py", "10", str(tmp_path / "n"), "1000000")
        gpuq.wait_state(counter, "running")
        wait_for(lambda: gpuq.job(counter)["peak_mem"], 30, "the counter's memory to be seen")
        gpuq.run("suspend", str(counter))
        gpuq.wait_state(counter, "suspended")
        failed = gpuq.submit("--gpus", "1", "--name", "diverged", "sh", "-c", "exit 3")
        gpuq.wait_state(failed, "failed")
        cancelled = gpuq.submit("--gpus", "1", "--name", "typo", "sleep", "300")
        gpuq.wait_state(cancelled, "running")
        gpuq.run("cancel", str(cancelled))
        gpuq.wait_state(cancelled, "cancelled")
        gpuq.run("resume", str(counter))
        gpuq.wait_state(counter, "running")
        resumed = time.monotonic()  # a stretch running again after the stripes, worth a look
        wait_for(lambda: time.monotonic() > resumed + 3, 30, "the counter to run on")
        server = Served(gpuq)
        try:
            status, page = server.get("/")
            assert status == 200
        finally:
            server.close()
        assert gpuq.job(long)["state"] == "running"
        # The page as served, shot and measured as one (served twice, its axis would have moved on between).
        served = tmp_path / "dashboard.html"
        served.write_text(re.sub(r'<meta http-equiv="refresh"[^>]*>', "", page))
        shot = tmp_path / "dashboard.png"
        chromium(tmp_path, f"--screenshot={shot}", served.as_uri())
    finally:
        gpuq.cleanup()
    if os.environ.get("GPUQ_SCREENSHOT_DIR"):
        keep = Path(os.environ["GPUQ_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / "gpuq-serve-1400x900.png")
    width, height, pixels = read_png(shot)
    assert (width, height) == (1400, 900)
    layout = measure(tmp_path, page)
    left, top, svg_w, svg_h = layout["svg"]
    assert top + svg_h <= height and left + svg_w <= width, "the timeline is below the fold"
    legend = layout["legend"]
    assert legend is not None and legend[1] + legend[3] <= height, "no legend on screen"
    assert "time suspended" in page and "cancelled" in page

    # The axis is the span drawn, not the window the GPU-hours are summed over.
    heading = re.search(r"<h2>Timeline, last ([^<]*)</h2>", page)
    assert heading and not heading.group(1).startswith("6 h"), heading

    def drawn(colour: tuple[int, int, int], box: list[float]) -> int:
        x, y, w, h = (int(v) for v in box)
        return sum(near(pixels[py * width + px], colour) for py in range(y, y + h) for px in range(x, x + w))

    bars = {int(job): box for job, _, box in layout["jobs"]}
    # A failed and a cancelled job: bars wide enough to see in their colours, named beside them if not inside.
    for job, colour, state in ((failed, FAILED_RED, "failed"), (cancelled, CANCELLED_GREY, "cancelled")):
        assert bars[job][2] >= 5 and drawn(colour, bars[job]) >= 0.5 * bars[job][2] * bars[job][3], state
        labels = [box for text, box in layout["labels"] if text in (str(job), f"{job} {state}")]
        assert labels and all(b[0] + b[2] <= left + svg_w for b in labels), f"job {job} is not named"
    # The counter's time suspended: amber stripes inside its own bar, and not all of it (it ran before and after).
    stripes = [box for job, box in layout["suspended"] if int(job) == counter]
    assert stripes, "its time suspended is not marked"
    x, _, w, _ = bars[counter]
    assert x <= stripes[0][0] and stripes[0][0] + stripes[0][2] < x + w
    assert drawn(SUSPENDED_AMBER, stripes[0]) > 0.3 * stripes[0][2] * stripes[0][3]

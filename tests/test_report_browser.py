"""The HTML report in a real headless browser (Debian's chromium): what it shows, not just what it says.

A real small run goes through a real daemon on fake GPUs; its report is opened in chromium, which takes a
screenshot (kept under tmp_path, and copied to $GPUQ_SCREENSHOT_DIR when set) and dumps the DOM. The
screenshot is decoded with the stdlib and must show the timeline's bars in their state colours; a copy of
the page with a measuring script added reports where chromium laid out the lanes and bars.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.jobs.store.statedir import StateDir
from gpuq_scheduler.launcher.views.report import build_report
from gpuq_scheduler.launcher.views.report_html import render_html, sub_lanes
from tests.conftest import REPORT, Gpuq

CHROMIUM = shutil.which("chromium")
# CI installs chromium (.ci/run), so there a missing browser is a failure, not a skip.
pytestmark = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"), reason="needs Debian's chromium: apt-get install chromium"
)
WIDTH, HEIGHT = 1400, 900
GREEN, RED = (0x2E, 0x7D, 0x32), (0xC6, 0x28, 0x28)  # succeeded and failed bars (launcher.views.report_html._COLOURS)

# Copied into a test-only copy of the page: the real page has no script, and its CSP would refuse this one.
MEASURE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
const out = document.createElement("pre"); out.id = "layout";
out.textContent = JSON.stringify({
  svg: box(document.getElementById("timeline")),
  lanes: [...document.querySelectorAll("#timeline .lane")].map(g => [g.textContent.trim(), box(g)]),
  jobs: [...document.querySelectorAll("#timeline rect.job")].map(r => [r.dataset.job, r.dataset.gpu, box(r)]),
  labels: [...document.querySelectorAll("#timeline .job-label")].map(t => [t.textContent, box(t)]),
  suspended: [...document.querySelectorAll("#timeline rect.suspended")].map(r => [r.dataset.job, box(r)]),
  legend: document.getElementById("legend") ? box(document.getElementById("legend")) : null,
});
document.body.appendChild(out);
</script>"""


def chromium(tmp_path: Path, *args: str, size: tuple[int, int] = (WIDTH, HEIGHT)) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{time.monotonic_ns()}"  # a fresh, empty profile each run
    profile.mkdir()
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--force-color-profile=srgb",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
        *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def read_png(path: Path) -> tuple[int, int, list[tuple[int, ...]]]:
    """Width, height and RGB pixels of an 8-bit RGB or RGBA PNG, decoded with zlib (no image library)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks = 8, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), f"unexpected PNG format: depth {depth}, colour type {colour}"
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * bpp
    pixels, prev = [], bytearray(stride)
    for y in range(height):
        kind_of_filter, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride) if kind_of_filter else ():
            left = line[i - bpp] if i >= bpp else 0
            up, corner = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind_of_filter == 1:
                line[i] = (line[i] + left) & 255
            elif kind_of_filter == 2:
                line[i] = (line[i] + up) & 255
            elif kind_of_filter == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 255
            else:  # Paeth: the neighbour closest to left + up - corner
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        pixels += [tuple(line[x : x + 3]) for x in range(0, stride, bpp)]
        prev = line
    return width, height, pixels


def measure(tmp_path: Path, page: str) -> dict[str, Any]:
    """Where chromium lays out the timeline of ``page`` (HTML): a copy without its CSP and reload, with
    the measuring script added at the end of the body (below everything it measures)."""
    measured = tmp_path / f"measured-{time.monotonic_ns()}.html"
    without_meta = re.sub(r'<meta http-equiv="(Content-Security-Policy|refresh)"[^>]*>', "", page)
    measured.write_text(without_meta.replace("</body>", MEASURE + "</body>"))
    found = re.search(r'<pre id="layout">(.*?)</pre>', chromium(tmp_path, "--dump-dom", measured.as_uri()).stdout)
    assert found, "the measuring script did not run"
    layout: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return layout


def near(pixel: tuple[int, ...], colour: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 3 for a, b in zip(pixel, colour, strict=True))


def test_report_renders_in_headless_chromium_with_the_timeline_visible(gpuq: Gpuq, tmp_path: Path) -> None:
    out = str(gpuq.cwd / "r.jsonl")
    warmup = gpuq.submit("--gpus", "1", "--name", "warmup", str(REPORT), out, "1")
    pair = gpuq.submit("--gpus", "2", "--name", "<b>seed 3</b>", str(REPORT), out, "1.3")
    bad = gpuq.submit("--gpus", "1", "--name", "diverged", str(REPORT), out, "0.6", "3")
    big = gpuq.submit("--gpus", "4", "--name", "all four", str(REPORT), out, "1")  # waits for the others
    gpuq.run("wait", check=False)  # exits 1: `diverged` fails on purpose
    queue = Queue(StateDir(gpuq.home))
    inventory = queue.inventory()
    assert inventory is not None
    report = build_report(queue.records(), len(inventory.totals), now=time.time(), since=3600)
    page = tmp_path / "report.html"
    page.write_text(render_html(report))

    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", page.as_uri())
    if os.environ.get("GPUQ_SCREENSHOT_DIR"):
        keep = Path(os.environ["GPUQ_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / "report-timeline.png")
        shutil.copy(page, keep / "report.html")
    width, height, pixels = read_png(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    colours = Counter(pixels)
    assert len(colours) > 50, "the screenshot is (nearly) blank"
    # Bars big enough to see, in the colours of their states: the succeeded ones and the failed one.
    assert sum(n for c, n in colours.items() if near(c, GREEN)) > 5000
    assert sum(n for c, n in colours.items() if near(c, RED)) > 500

    # The DOM chromium built from the page: the escaped name is text, the SVG is intact.
    dom = chromium(tmp_path, "--dump-dom", page.as_uri()).stdout
    assert '<svg id="timeline"' in dom and "&lt;b&gt;seed 3&lt;/b&gt;" in dom and "<b>seed" not in dom
    rects = set(re.findall(r'<rect class="job state-(\w+)" data-job="(\d+)" data-gpu="(\d+)"', dom))
    assert {(s, int(j)) for s, j, _ in rects} == {
        ("succeeded", warmup),
        ("succeeded", pair),
        ("failed", bad),
        ("succeeded", big),
    }
    assert sorted(int(g) for _, j, g in rects if int(j) == big) == [0, 1, 2, 3]

    # Where chromium put things: every lane and bar on screen, inside the timeline, each bar in its lane.
    layout = measure(tmp_path, page.read_text())
    left, top, svg_w, svg_h = layout["svg"]
    assert left >= 0 and top >= 0 and left + svg_w <= WIDTH and top + svg_h <= HEIGHT, "timeline not all on screen"
    lanes = {name: box for name, box in layout["lanes"]}
    assert list(lanes) == ["GPU 0", "GPU 1", "GPU 2", "GPU 3"]
    assert len(layout["jobs"]) == 2 + 1 + 1 + 4
    for job_id, gpu, (x, y, w, h) in layout["jobs"]:
        _, lane_y, _, lane_h = lanes[f"GPU {gpu}"]
        assert w >= 20 and h >= 20, f"job {job_id}'s bar on GPU {gpu} is too small to see"
        assert lane_y <= y and y + h <= lane_y + lane_h and left <= x and x + w <= left + svg_w
    assert {text for text, _ in layout["labels"]} == {str(i) for i in (warmup, pair, bad, big)}

    # The real page refuses scripts even if one slipped past the escaping.
    blocked = tmp_path / "blocked.html"
    blocked.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    assert 'id="layout"' not in chromium(tmp_path, "--dump-dom", blocked.as_uri()).stdout


def test_jobs_packed_at_once_on_a_gpu_get_rows_of_their_own_and_rows_are_reused() -> None:
    """Bars as (left, right) pixels on one GPU: overlapping ones never share a row; a freed row is reused."""
    assert sub_lanes([(0, 10), (5, 15), (10, 20), (12, 13)]) == [0, 1, 0, 2]
    assert sub_lanes([(30, 40), (0, 10), (10, 20)]) == [0, 0, 0]  # one after another: one row
    assert sub_lanes([]) == []

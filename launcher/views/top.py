"""`gpuq top`: the live view of the box, redrawn about once a second (textual, the optional ``top`` extra).

Per GPU a memory bar (gpuq's jobs, reserved but unused, outside gpuq, free) with utilisation, free memory,
fence and state; below, the running jobs (reserved against what they use now, runtime, time left) and the
waiting ones with why they wait. Keys: ``s`` sort, ``m`` my jobs only, ``e`` expand arrays, ``l`` follow
the selected job's log, ``c`` cancel and ``h`` hold/release the selected job (each after a ``y``), ``tab``
between the tables, ``q`` quit. Reads the state directory and the GPUs as every reader does; acts through
the same requests as the CLI, so the daemon checks ownership again.
"""

from __future__ import annotations

import dataclasses
import getpass
import os
from pathlib import Path
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Label, RichLog, Static

from gpuq_scheduler.jobs.api import ensure_daemon
from gpuq_scheduler.jobs.errors import GpuqError
from gpuq_scheduler.jobs.model import JobRecord
from gpuq_scheduler.jobs.store.actions import Action
from gpuq_scheduler.jobs.store.queue import Queue
from gpuq_scheduler.launcher.gpus.sources import open_source
from gpuq_scheduler.launcher.views import live

BAR = 30  # characters of a GPU's memory bar at least: the label beside it still fits 80 columns
WIDEST_BAR = 120  # ...and at most, however wide the terminal: one character stays a readable share of a GPU


class Confirm(ModalScreen[bool]):
    """A yes/no question over the view; ``y`` says yes, anything in BINDINGS' ``n``/``escape`` says no."""

    BINDINGS: ClassVar[list[Any]] = [("y", "answer(True)", "yes"), ("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Label(f"{self.question}  [y/n]", id="question")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class LogView(ModalScreen[None]):
    """The end of a job's log, followed as it grows; ``escape`` or ``q`` goes back."""

    BINDINGS: ClassVar[list[Any]] = [("escape,q", "app.pop_screen", "back")]

    def __init__(self, record: JobRecord) -> None:
        super().__init__()
        self.job, self.read_from, self.cut = record, 0, False

    def compose(self) -> ComposeResult:
        yield Label(f"log of job {self.job.id} ({self.job.spec.display_name}): {self.job.log}   [q: back]")
        yield RichLog(id="log", wrap=True, max_lines=2000)

    def on_mount(self) -> None:
        path = Path(self.job.log)
        try:
            self.read_from = max(0, path.stat().st_size - 64 * 1024)  # the last 64 KiB, then what follows
        except OSError:
            self.read_from = 0
        self.cut = self.read_from > 0  # started mid-file: its first line is only a line's end
        self.follow()
        self.set_interval(0.5, self.follow)

    def follow(self) -> None:
        try:
            with open(self.job.log, "rb") as handle:
                handle.seek(self.read_from)
                chunk = handle.read()
        except OSError as err:
            self.query_one(RichLog).write(f"(cannot read the log: {err.strerror})")
            return
        if chunk:
            self.read_from += len(chunk)
            text = chunk.decode(errors="replace")
            if self.cut:
                text, self.cut = text.partition("\n")[2], False
            if text.rstrip("\n"):
                self.query_one(RichLog).write(as_shown(text.rstrip("\n")))


def as_shown(text: str) -> str:
    """A log's lines as a terminal leaves them: a progress bar redrawn with carriage returns (tqdm's) is its
    last drawing, without what longer earlier ones left behind; a line's escapes to clear are taken away."""
    lines = []
    for line in text.split("\n"):
        drawn = [part for part in line.replace("\x1b[K", "").replace("\x1b[2K", "").split("\r") if part]
        lines.append(drawn[-1] if drawn else "")
    return "\n".join(lines)


class Top(App[None]):
    CSS = """
    #gpus { height: auto; }
    #summary { height: 1; color: $text-muted; }
    #message { height: 1; color: $warning; }
    DataTable { height: auto; max-height: 12; }
    .caption { height: 1; text-style: bold; }
    Confirm, LogView { align: center middle; }
    #question { border: round $warning; padding: 0 1; background: $panel; }
    """
    BINDINGS: ClassVar[list[Any]] = [
        Binding("q", "quit", "quit"),
        Binding("s", "sort", "sort"),
        Binding("m", "mine", "mine"),
        Binding("e", "expand", "arrays"),
        Binding("l", "log", "log"),
        Binding("c", "cancel", "cancel"),
        Binding("h", "hold", "hold"),
    ]

    def __init__(self, queue: Queue, interval: float = 1.0, mine: bool = False) -> None:
        super().__init__()
        self.queue, self.interval, self.mine = queue, interval, mine
        self.sort, self.expanded, self.me = "id", False, getpass.getuser()
        self.source = open_source()
        self.picture: live.Picture | None = None
        self.shown: dict[str, list[JobRecord]] = {"running": [], "waiting": []}

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(id="gpus")
            yield Static(id="summary")
            yield Static("running", classes="caption")
            yield DataTable(id="running", cursor_type="row", zebra_stripes=False)
            yield Static("waiting", classes="caption")
            yield DataTable(id="waiting", cursor_type="row", zebra_stripes=False)
            yield Static(id="message")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"gpuq top: {self.queue.state.root}"
        self.query_one("#running", DataTable).add_columns(*live.RUNNING_COLUMNS)
        self.query_one("#waiting", DataTable).add_columns(*live.WAITING_COLUMNS)
        self.refresh_picture()
        self.set_interval(self.interval, self.refresh_picture)

    def on_unmount(self) -> None:
        self.source.close()

    def refresh_picture(self) -> None:
        try:
            picture = live.take(self.queue, self.source)
        except GpuqError as err:
            self.say(str(err))
            return
        self.picture = picture
        if self.mine:
            picture = live.only(picture, self.me)
        counted = live.summary(picture, self.sort, self.mine)  # jobs, before an array's members fold into a row
        folded: dict[str, dict[int, int]] = {"running": {}, "waiting": {}}  # per table: array -> members folded
        if not self.expanded:
            (running, folded["running"]), (waiting, folded["waiting"]) = (
                live.fold(picture.running),
                live.fold(picture.waiting),
            )
            picture = dataclasses.replace(picture, running=running, waiting=waiting)
        lines = []
        for gpu in picture.gpus:
            detail = live.gpu_detail(gpu)
            width = min(WIDEST_BAR, max(BAR, self.size.width - len(detail) - 4))  # a wide terminal, a longer bar
            lines += [live.gpu_label(gpu), f"[{live.bar(gpu, width)}] {detail}"]
        self.query_one("#gpus", Static).update("\n".join(lines) or "no GPUs found (GPUQ_FAKE_GPUS=4x80GiB to try)")
        self.query_one("#summary", Static).update(counted)
        self._fill("running", picture.running, live.running_rows(picture, self.sort, folded["running"]))
        self._fill("waiting", picture.waiting, live.waiting_rows(picture, self.sort, folded["waiting"]))

    def _fill(self, name: str, records: list[JobRecord], rows: list[tuple[str, ...]]) -> None:
        table = self.query_one(f"#{name}", DataTable)
        row = table.cursor_row
        table.clear()
        for cells in rows:
            table.add_row(*cells, key=cells[0])
        order = {r.id: r for r in records}
        self.shown[name] = [order[int(cells[0])] for cells in rows]
        if rows:
            table.move_cursor(row=min(row, len(rows) - 1))

    def selected(self) -> JobRecord | None:
        """The job under the cursor of the focused table (the running one when neither has focus)."""
        focused = self.focused if isinstance(self.focused, DataTable) else self.query_one("#running", DataTable)
        jobs = self.shown.get(str(focused.id), [])
        if not jobs or not 0 <= focused.cursor_row < len(jobs):
            self.say("no job selected (tab moves between the running and waiting tables)")
            return None
        return jobs[focused.cursor_row]

    def say(self, text: str) -> None:
        self.query_one("#message", Static).update(text)

    def action_sort(self) -> None:
        self.sort = live.SORTS[(live.SORTS.index(self.sort) + 1) % len(live.SORTS)]
        self.refresh_picture()

    def action_mine(self) -> None:
        self.mine = not self.mine
        self.refresh_picture()

    def action_expand(self) -> None:
        self.expanded = not self.expanded
        self.refresh_picture()

    def action_log(self) -> None:
        record = self.selected()
        if record is not None:
            self.push_screen(LogView(record))

    def action_cancel(self) -> None:
        record = self.selected()
        if record is not None:
            self._confirm(f"cancel job {record.id} ({record.spec.display_name})?", self._cancel, record)

    def action_hold(self) -> None:
        record = self.selected()
        if record is None:
            return
        action = "release" if record.held else "hold"
        if record.state.value != "pending":
            self.say(f"job {record.id} is {record.state.value}: only waiting jobs are held or released")
            return
        self._confirm(f"{action} job {record.id} ({record.spec.display_name})?", self._hold, record)

    def _confirm(self, question: str, then: Any, record: JobRecord) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                then(record)
            else:
                self.say("nothing done")

        self.push_screen(Confirm(question), answered)

    def _cancel(self, record: JobRecord) -> None:
        try:
            done = self.queue.cancel([record.id])
            ensure_daemon(self.queue.state)
        except GpuqError as err:
            self.say(str(err))
            return
        self.say(f"cancelling job {record.id}" if done else f"job {record.id} had already ended")

    def _hold(self, record: JobRecord) -> None:
        action = Action.RELEASE if record.held else Action.HOLD
        try:
            self.queue.control(action, [record.id])
            ensure_daemon(self.queue.state)
        except GpuqError as err:
            self.say(str(err))
            return
        self.say(f"{'released' if record.held else 'held'} job {record.id}")


def run(queue: Queue, interval: float = 1.0, mine: bool = False) -> None:
    if not os.isatty(1):
        raise GpuqError("gpuq top needs a terminal; `gpuq status` and `gpuq gpus --json` print the same for scripts")
    Top(queue, interval, mine).run()

"""The ``gpuq`` command's entry point: a plain ``gpuq submit`` (``submit``), ``gpuq suspend ID...`` or
``gpuq resume ID...`` (``suspend``) takes the quick path, without click; everything else goes to click
(``app``), imported only then."""

from __future__ import annotations

import os
import sys

from gpuq_scheduler.jobs.errors import GpuqError

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if _quick(args):
            if argv is None:  # the `gpuq` command itself: its output is flushed, nothing is left to do
                os._exit(0)  # the interpreter's teardown cost ~2 ms of a 20 ms submit (measured)
            return
    except GpuqError as err:
        _error(f"gpuq: {err}")
        sys.exit(err.exit_code)
    except (KeyboardInterrupt, EOFError):
        _error("\naborted")  # as click: a blank line, then launcher.cli.app's word for it
        sys.exit(130)
    from gpuq_scheduler.launcher.cli.app import main as click_main

    click_main(args)


def _quick(args: list[str]) -> bool:
    """Whether the command ran here, without click. Only the command itself as the first word: a global
    option before it (--debug) and shell completion are click's."""
    if "_GPUQ_COMPLETE" in os.environ or not args:
        return False
    if args[0] == "submit":
        from gpuq_scheduler.launcher.cli import submit

        parsed = submit.parse(args[1:])
        return parsed is not None and not submit.needs_click(parsed[0]) and submit.submit(*parsed)
    if args[0] in ("suspend", "resume"):
        from gpuq_scheduler.launcher.cli import suspend

        # The word is Action.SUSPEND's or Action.RESUME's value, and an Action is a str: the quick path
        # passes the word itself rather than load enum for the member.
        return suspend.quick(args[0], args[1:])  # type: ignore[arg-type]
    return False


def _error(line: str) -> None:
    """One line on stderr, as click.echo writes it (escapes stripped where it is not a terminal)."""
    if not sys.stderr.isatty():
        import re  # ~4 ms: paid by errors only

        line = re.sub(r"\033\[[0-?]*[ -/]*[@-~]", "", line)  # what click.echo strips when not on a terminal
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    main()

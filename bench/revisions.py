"""Several git revisions of gpuq side by side in one run, each imported in a fresh interpreter from a temporary
worktree (``python -S``, so that this checkout's editable install does not shadow it): what
``bench/spool_read.py`` and ``bench/daemon_pass.py`` share.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def arguments(doc: str | None) -> argparse.Namespace:
    """The command line every such script takes: REV... and --rounds."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revs", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def turns(args: argparse.Namespace) -> Iterator[tuple[int, str]]:
    """(round, revision): every revision in turn, round after round."""
    return ((round_, rev) for round_, rev in itertools.product(range(1, args.rounds + 1), args.revs))


@contextlib.contextmanager
def worktrees(work: Path, revs: list[str]) -> Iterator[None]:
    """A worktree of each revision under ``work`` (``tree(work, rev)``), removed after."""
    for rev in revs:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree(work, rev)), rev], check=True
        )
        (work / f"pkg-{rev}").mkdir()
        (work / f"pkg-{rev}" / "gpuq_scheduler").symlink_to(tree(work, rev))
    try:
        yield
    finally:
        for rev in revs:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree(work, rev))])


def tree(work: Path, rev: str) -> Path:
    return work / f"tree-{rev}"


def run(work: Path, rev: str, code: str, *args: str) -> str:
    """``code`` run with ``args`` by a fresh interpreter that imports ``rev``'s gpuq: what it printed. SystemExit
    with its error if it failed."""
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {**os.environ, "PYTHONPATH": f"{work / f'pkg-{rev}'}:{site}"}
    # From the temporary directory: `python -c` puts its directory first on the path, and this checkout's root
    # holds a gpuq_scheduler of its own.
    done = subprocess.run([sys.executable, "-S", "-c", code, *args], env=env, capture_output=True, text=True, cwd=work)
    if done.returncode:
        raise SystemExit(f"{rev}: {done.stderr.strip()}")
    return done.stdout.strip()

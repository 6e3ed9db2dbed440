"""The package laid out as it installs (``gpuq_scheduler/{jobs,launcher}``), for the tools that read files
rather than import: mypy and import-linter know nothing of setuptools' ``package-dir`` mapping, which an
editable install serves through an import hook (``__editable___*_finder.py``) that static tools cannot see.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "installed"  # ignored by git; kept between runs so mypy's cache stays warm
FOLDERS = {"gpuq_scheduler": "", "jobs": "jobs", "launcher": "launcher"}  # source folder -> place in the package


def installed_tree() -> Path:
    """Mirror every .py file into ``build/installed/gpuq_scheduler/`` (copies keep their mtimes, so mypy's
    cache sees unchanged files as unchanged) and drop files whose source is gone. Returns the tree's root."""
    package = TREE / "gpuq_scheduler"
    wanted: set[Path] = set()
    for source, place in FOLDERS.items():
        for path in (ROOT / source).rglob("*.py"):
            target = package / place / path.relative_to(ROOT / source)
            wanted.add(target)
            if not target.exists() or target.stat().st_mtime_ns != path.stat().st_mtime_ns:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    for stale in package.rglob("*.py"):
        if stale not in wanted:
            stale.unlink()
    return TREE


def source_path(text: str) -> str:
    """Point paths in a tool's output back at the files a person edits."""
    for source, place in FOLDERS.items():
        prefix = f"gpuq_scheduler/{place}/" if place else "gpuq_scheduler/"
        if source != "gpuq_scheduler":
            text = text.replace(prefix, f"{source}/")
    return text

"""How much the daemon's steps lean on its shared state (issue 41, part 1), counted from the source.

    python bench/state_shape.py [TREE]        TREE: a checkout (default: this one)

- **attributes**: the distinct attributes of the shared state (``SchedulerState``, the scheduler) that the step
  modules reach for. A step module is a module of ``launcher/daemon/`` or its folders other than the state's own
  (``state.py``, ``owned.py``, ``tracked.py``, ``lives.py``) and the scheduler's; an attribute is a name read
  or written on a parameter annotated with the state's type (``scheduler.pending``, ``state.shims``). Per
  module, and in all.
- **through a Protocol**: a step that takes, instead of the state, a Protocol of ``launcher/daemon/`` that stands
  for it (one whose every member the state has: the watchdog's ``Stopping``) still leans on the state: the
  members it reaches through such a parameter are counted in a column of their own, so that narrowing shows as
  narrowing and not as hiding. Also per module: how many of its functions still take the whole state (most to
  hand it on to a step that does, ``endings.finish`` say).
- **forget**: the collections ``SchedulerState.forget`` names (each one it pops, discards or deletes from,
  or loops over to do so): each is one a new map must be added to, or it leaks.
- **walk**: ``python bench/state_shape.py --walk`` follows one submit through the daemon's ingest (a real
  state directory, what ``gpuq submit -- true`` spools, fake GPUs) with ``sys.setprofile``: the calls of
  gpuq's functions and how many distinct functions they are, the rooms (distinct modules), the calls into a
  room the walk had already left, the calls from a step back into the state's rooms (state, scheduler,
  owned, lives) and the user's name looked up (``accounts.user_name`` or ``account``, or ``pwd`` itself).
  Needs the package importable (the venv).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

STATE_TYPES = {"SchedulerState", "Scheduler"}
STATE_ROOMS = {f"gpuq_scheduler.launcher.daemon.{name}" for name in ("state", "scheduler", "owned", "lives")}
NOT_STEPS = {"state.py", "owned.py", "tracked.py", "lives.py", "scheduler.py", "__init__.py", "__main__.py"}


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef, types: set[str]) -> set[str]:
    """The names of ``func``'s parameters annotated with one of ``types``."""
    names = set()
    for arg in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]:
        note = arg.annotation
        text = ast.unparse(note) if note is not None else ""
        if text.strip("'\"").split(".")[-1] in types:
            names.add(arg.arg)
    return names


def _members(cls: ast.ClassDef) -> set[str]:
    """What a class declares in its body (methods, properties, annotated fields), and what its methods set on self."""
    found: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for inner in ast.walk(cls):
        if isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id == "self":
            found.add(inner.attr)
    return found


def state_protocols(tree: Path) -> set[str]:
    """The Protocols of ``launcher/daemon/`` that stand for the state: every member they declare is the state's
    (``SchedulerState``'s or the scheduler's). Those of a part of it (a helper, the forker) are not counted."""
    daemon = tree / "launcher" / "daemon"
    state: set[str] = set()
    protocols: dict[str, set[str]] = {}
    for path in sorted(daemon.rglob("*.py")):
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            if cls.name in STATE_TYPES:
                state |= _members(cls)
            elif any(ast.unparse(base).split(".")[-1] == "Protocol" for base in cls.bases):
                protocols[cls.name] = _members(cls)
    return {name for name, members in protocols.items() if members and members <= state}


def attributes(tree: Path, types: set[str] = STATE_TYPES) -> dict[str, set[str]]:
    """Step module -> the state's attributes it uses through parameters annotated with one of ``types``."""
    used: dict[str, set[str]] = {}
    daemon = tree / "launcher" / "daemon"
    for path in _steps(daemon):
        found: set[str] = set()
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = _params(func, types)
            for node in ast.walk(func):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in params:
                    found.add(node.attr)
        if found:
            used[path.relative_to(daemon).with_suffix("").as_posix()] = found
    return used


def taking_state(tree: Path) -> dict[str, int]:
    """Step module -> how many of its functions take the whole state (to use it, or to hand it on)."""
    daemon = tree / "launcher" / "daemon"
    counts: dict[str, int] = {}
    for path in _steps(daemon):
        functions = [
            func
            for func in ast.walk(ast.parse(path.read_text()))
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and _params(func, STATE_TYPES)
        ]
        if functions:
            counts[path.relative_to(daemon).with_suffix("").as_posix()] = len(functions)
    return counts


def _steps(daemon: Path) -> list[Path]:
    """The step modules: the daemon's, its folders' too (suspension/, watching/), not the state's own."""
    return [
        path
        for path in sorted(daemon.rglob("*.py"))
        if not ((path.name in NOT_STEPS and path.parent == daemon) or path.name == "__init__.py")
    ]


def forget_maps(tree: Path) -> list[str]:
    """The collections ``SchedulerState.forget`` names, as written (``self.`` left off)."""
    source = (tree / "launcher" / "daemon" / "state.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "forget":
            forget = node
            break
    else:
        raise SystemExit("no SchedulerState.forget")
    named: list[str] = []

    def add(expr: ast.expr) -> None:
        text = ast.unparse(expr).removeprefix("self.")
        if text not in named:
            named.append(text)

    for node in ast.walk(forget):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in {"pop", "discard", "remove", "lost"}:
                add(node.func.value)
        elif isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Subscript):
                    add(target.value)
        elif isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            for element in node.iter.elts:  # for table in (a, b, c): table.pop(...)
                add(element)
    return [name for name in named if name not in {"table"}]


def walk(tree: Path) -> dict[str, int]:
    import tempfile
    import time

    from gpuq_scheduler.jobs import api
    from gpuq_scheduler.jobs.model import JobSpec
    from gpuq_scheduler.jobs.store.statedir import StateDir
    from gpuq_scheduler.launcher.daemon.scheduler import Scheduler
    from gpuq_scheduler.launcher.gpus.fake import FakeGpus

    with tempfile.TemporaryDirectory(prefix="gpuq walk ") as tmp:
        state = StateDir(Path(tmp) / "state")
        # What `gpuq submit -- true` writes to the spool (api.submit without starting a daemon).
        api.queue_job(state, JobSpec.from_json(api._capture(["true"], {"cwd": tmp})))
        scheduler = Scheduler(state, FakeGpus("4x80GiB"))
        try:
            stops: list[tuple[str, str]] = []  # (module, function) of each call of gpuq's code, in order
            climbs, back, names = 0, 0, 0
            stack: list[str] = []

            def profile(frame, event, arg):  # type: ignore[no-untyped-def]
                nonlocal climbs, back, names
                if event == "c_call" and getattr(arg, "__module__", None) == "pwd":
                    names += 1
                if event == "call":
                    module = frame.f_globals.get("__name__", "")
                    ours = module.startswith("gpuq_scheduler")
                    if ours:
                        if frame.f_code.co_name in {"user_name", "account"}:
                            names += 1
                        caller = next((m for m in reversed(stack) if m), None)
                        if caller and caller != module:
                            if module in STATE_ROOMS and caller not in STATE_ROOMS:
                                climbs += 1
                            if any(m == module for m, _ in stops):
                                back += 1
                        stops.append((module, frame.f_code.co_name))
                    stack.append(module if ours else "")
                elif event == "return" and stack:
                    stack.pop()

            sys.setprofile(profile)
            try:
                scheduler.ingest(time.time())
            finally:
                sys.setprofile(None)
        finally:
            scheduler.close()
    return {
        "calls": len(stops),
        "functions": len(set(stops)),
        "rooms": len({m for m, _ in stops}),
        "calls into a room already left": back,
        "calls back into the state": climbs,
        "user name looked up": names,
    }


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--walk"]
    tree = Path(args[0] if args else Path(__file__).resolve().parent.parent)
    used = attributes(tree)
    protocols = state_protocols(tree)
    through = attributes(tree, protocols)
    taking = taking_state(tree)
    everything = set().union(*used.values())
    print(f"{'module':22s} {'state':>5s} {'proto':>5s} {'takes':>5s}  the state's attributes | through a Protocol")
    for module in sorted(set(used) | set(through) | set(taking)):
        names, members = used.get(module, set()), through.get(module, set())
        line = f"{module:22s} {len(names):5d} {len(members):5d} {taking.get(module, 0):5d}  {' '.join(sorted(names))}"
        print(line + (f" | {' '.join(sorted(members))}" if members else ""))
    print(f"attributes of the shared state used by {len(used)} step modules: {len(everything)}")
    reached = set().union(*through.values()) if through else set()
    print(
        f"members of the state reached through Protocols that stand for it ({', '.join(sorted(protocols))}) "
        f"by {len(through)} step modules: {len(reached)}; both together: {len(everything | reached)}"
    )
    print(f"functions of step modules that take the whole state: {sum(taking.values())} in {len(taking)} modules")
    maps = forget_maps(tree)
    print(f"collections listed in forget: {len(maps)}  ({', '.join(maps)})")
    if "--walk" in sys.argv:
        print("submit walk through ingest:", walk(tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())

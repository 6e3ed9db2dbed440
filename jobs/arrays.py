"""``--array``'s words as a submit reads them: indices (``0-49%8``, ``1,3,7``, ``0-20:5``) or named values
(``lr=1e-4,3e-4``, ``seed=0-7``), each checked and refused in one line before anything is written.

Light on purpose, like everything the quick submit path loads.
"""

from __future__ import annotations

from gpuq_scheduler.jobs.errors import BadInput
from gpuq_scheduler.jobs.rules import MAX_ARRAY, check_array, check_sweep, sweep_size

TYPE_CHECKING = False  # typing costs ~3 ms to import; only the type checker needs these names
if TYPE_CHECKING:
    from collections.abc import Sequence


def parse_arrays(texts: Sequence[str]) -> tuple[tuple[int, ...], int | None, tuple[tuple[str, tuple[str, ...]], ...]]:
    """Every ``--array`` given: (member indices, how many run at once, the sweep). Indices once (``0-49%8``),
    or named values, one name each time (``lr=1e-4,3e-4,1e-3``, ``seed=1,2,3%4``): their product, one member
    per combination, indexed 0, 1, ... in itertools.product's order. Nothing given: no array; an empty one is
    refused (``--array ''`` once queued a plain job)."""
    given = list(texts)
    for text in given:
        if not text.strip():
            parse_array(text)  # raises, saying how indices are written
    named = [text for text in given if "=" in text]
    if not named:
        if len(given) > 1:
            raise BadInput(f"--array {given[1]!r}: give the indices once, like --array 0-49 or --array 1,3,7")
        if not given:
            return (), None, ()
        indices, throttle = parse_array(given[0])
        return indices, throttle, ()
    if len(named) < len(given):
        hint = "give indices (--array 0-9) or named values (--array lr=1e-4,3e-4), not both"
        raise BadInput(f"--array {next(t for t in given if '=' not in t)!r}: {hint}")
    sweep, throttle = [], None
    for text in named:
        name, _, rest = text.partition("=")
        body, percent, tail = rest.rpartition("%")
        if percent and tail.isdigit():
            if int(tail) < 1:
                raise BadInput(f"--array {text!r}: the part after % is how many run at once, a number >= 1")
            throttle, rest = int(tail), body
        values: list[str] = []
        for value in rest.split(","):
            values += sweep_range(value.strip(), text)
            if len(values) > MAX_ARRAY:  # before ranges past it are spelt out
                raise BadInput(f"--array {text[:60]!r}: more than {MAX_ARRAY} values; at most {MAX_ARRAY}")
        sweep.append((name.strip(), tuple(values)))
    check_sweep(sweep)
    return tuple(range(sweep_size(sweep))), throttle, tuple(sweep)


def sweep_range(value: str, text: str) -> list[str]:
    """One of a named sweep's comma-separated values: a range of whole numbers ``A-B`` or ``A-B:STEP``
    (``seed=0-7``, ``seed=0-20:5``) is its numbers, as indices are; anything else (``1e-4``, ``-1``,
    ``a-b``, ``2024-01-05``) is one value, as written. Conservative on purpose: a range is digits, one dash,
    digits, from the smaller to the larger (``7-0`` is refused, not read as text); leading zeros set the
    width (``01-12``: 01, 02, ... 12)."""
    span, colon, step_text = value.partition(":")
    first, dash, last = span.partition("-")
    numbers = first + last + step_text
    if not (dash and first and last and all(c in "0123456789" for c in numbers)) or (colon and not step_text):
        return [value]
    if colon and int(step_text) == 0:
        raise BadInput(f"--array {text[:60]!r}: {value}'s step after : is a whole number of 1 or more, like 0-20:5")
    start, stop, step = int(first), int(last), int(step_text) if colon else 1
    if stop < start:
        raise BadInput(
            f"--array {text[:60]!r}: the range {value} goes down; write it from the smaller number, like {last}-{first}"
        )
    if (stop - start) // step >= MAX_ARRAY:
        raise BadInput(f"--array {text[:60]!r}: {value} is more than {MAX_ARRAY} values; at most {MAX_ARRAY}")
    width = len(first) if first[0] == "0" and len(first) > 1 else 0
    return [str(number).zfill(width) for number in range(start, stop + 1, step)]


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """``0-49%8`` -> (0..49, 8); ``1,3,7`` -> (1, 3, 7); ``0-20:5`` -> (0, 5, 10, 15, 20). Sorted, unique."""
    hint = "write indices like 0-49, 1,3,7 or 0-20:5, and %N to run N at once"
    if not text.strip() or not text.isascii():  # int() reads Unicode's digits too: only 0-9 are indices here
        raise BadInput(f"--array {text[:40]!r}: {hint}")
    body, _, throttle_text = text.partition("%")
    throttle = None
    if throttle_text:
        if not throttle_text.isdigit() or not 0 < int(throttle_text) <= MAX_ARRAY:
            raise BadInput(
                f"--array {text[:40]!r}: the part after % is how many run at once, a number from 1 to {MAX_ARRAY}"
            )
        throttle = int(throttle_text)
    indices: set[int] = set()
    for part in body.split(","):
        span, _, step_text = part.strip().partition(":")
        first, dash, last = span.partition("-")
        try:
            start = int(first)
            stop = int(last) if dash else start
            step = int(step_text) if step_text else 1
        except ValueError:
            raise BadInput(f"--array {text[:40]!r}: {hint}") from None
        if start < 0 or stop < start or step < 1:
            raise BadInput(f"--array {text[:40]!r}: ranges go from a smaller to a larger index, both 0 or more")
        if (stop - start) // step + len(indices) >= MAX_ARRAY:
            raise BadInput(f"--array {text[:40]!r}: at most {MAX_ARRAY} members in one array")
        indices.update(range(start, stop + 1, step))
    found = tuple(sorted(indices))
    check_array(found, throttle)
    return found, throttle

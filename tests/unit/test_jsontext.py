"""jobs.jsontext writes what the json package reads back to the same values."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq_scheduler.jobs import jsontext

# Every character, lone surrogates included (os.environ holds them for bytes that are not UTF-8).
TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF))
PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
    max_leaves=30,
)


@given(PLAIN)
def test_reads_back_as_the_same_values(value: Any) -> None:
    assert json.loads(jsontext.encode(value)) == value


@given(st.dictionaries(st.text(st.characters(max_codepoint=0xD7FF)), PLAIN, max_size=5))
def test_same_text_as_json_dumps_without_escapes_that_need_no_escaping(value: Any) -> None:
    assert jsontext.dumps(value) == json.dumps(value, ensure_ascii=False)


def test_the_values_json_writes_beyond_json() -> None:
    assert jsontext.dumps([math.inf, -math.inf]) == json.dumps([math.inf, -math.inf])
    assert math.isnan(json.loads(jsontext.dumps(math.nan)))
    assert jsontext.dumps((1, True, None)) == "[1, true, null]"


def test_a_lone_surrogate_becomes_an_escape() -> None:
    raw = b"caf\xe9"  # Latin-1 bytes in an environment variable: os.environ decodes them with surrogateescape
    value = raw.decode("utf-8", "surrogateescape")
    text = jsontext.encode({"V": value})
    assert text == b'{"V": "caf\\udce9"}'
    assert json.loads(text)["V"].encode("utf-8", "surrogateescape") == raw


@pytest.mark.parametrize("value", [{1: "a"}, {"a": object()}, b"bytes", {"a"}])
def test_what_has_no_json_form_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        jsontext.dumps(value)


def test_loads_neither_json_nor_re() -> None:
    code = "import sys, gpuq_scheduler.jobs.jsontext; print(sorted({'json', 're', 'enum'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env={"PYTHONPATH": _tree()}
    )
    assert done.stdout.strip() == "[]", done.stderr


def _tree() -> str:
    from tests.installed import installed_tree

    return str(installed_tree())

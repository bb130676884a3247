"""Every ``>>>`` example in ``src/stepscope`` runs and prints what it shows: one walker.

Each module whose source holds a ``>>>`` example is imported and its docstrings are run with
:mod:`doctest` (``ELLIPSIS``), from a fresh temporary directory (examples that write files write
there). An example may be skipped only with its reason beside it, as a comment before the
directive: ``>>> main(["verify", "runs/demo"])  # needs a recorded run  # doctest: +SKIP``.
"""

from __future__ import annotations

import doctest
import importlib
import re
import warnings
from pathlib import Path

import pytest

import stepscope

SRC = Path(stepscope.__file__).parent

#: ``# <reason>  # doctest: ... +SKIP``: a skip must say why.
SKIP_WITH_REASON = re.compile(r"#\s*\w[^#]*#\s*doctest:[^\n]*\+SKIP")

#: Files whose skips still lack a reason, and why they are not fixed here.
UNEXPLAINED_FOR_NOW: dict[str, str] = {}


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = sorted(
    module_name(path) for path in SRC.rglob("*.py") if ">>>" in path.read_text(encoding="utf-8")
)


def test_the_walker_finds_the_examples():
    assert len(MODULES) >= 100
    assert "stepscope.errors" in MODULES and "stepscope.runlog.view" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write here
    module = importlib.import_module(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # examples that trigger a check's warning
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    found = sum(len(t.examples) for t in doctest.DocTestFinder().find(module))
    assert found > 0, f"{name}: its >>> examples are not in any docstring"
    assert result.failed == 0


def test_every_skipped_example_says_why():
    unexplained = []
    for path in sorted(SRC.rglob("*.py")):
        if str(path.relative_to(SRC)) in UNEXPLAINED_FOR_NOW:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "+SKIP" in line and not SKIP_WITH_REASON.search(line):
                unexplained.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not unexplained, "\n".join(unexplained)

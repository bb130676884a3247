"""The example in docs/runlog.md runs, and every runlog module's docstring example passes."""

import doctest
import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "runlog.md"
MODULES = ["clocks", "evals", "masks", "names", "pending", "runlog", "sink", "view"]


def test_the_python_example_in_the_runlog_docs_runs(capsys):
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    exec(compile(block, str(DOC), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[0.1  0.05] [16 32 48]"
    assert out[1] == "[10]"
    assert out[2] == "True [16 16]"


@pytest.mark.parametrize("name", MODULES)
def test_module_examples(name):
    module = importlib.import_module(f"stepscope.runlog.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0

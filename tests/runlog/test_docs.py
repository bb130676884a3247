"""The example in docs/runlog.md runs (module examples: tests/test_doctests.py)."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "runlog.md"


def test_the_python_example_in_the_runlog_docs_runs(capsys):
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    exec(compile(block, str(DOC), "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[0.1  0.05] [16 32 48]"
    assert out[1] == "[10]"
    assert out[2] == "True [16 16]"

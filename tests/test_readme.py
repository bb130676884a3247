"""The README's usage example runs as written."""

import os
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(tmp_path, capsys):
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(block, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    zeros = capsys.readouterr().out
    assert zeros.startswith("[") and (tmp_path / "runs" / "a" / "manifest.json").exists()

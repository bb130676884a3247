"""The examples in docs/integrations.md run as written and print what the doc says."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
SECTIONS = re.split(r"^## ", DOC.read_text(), flags=re.M)


def _section(title: str) -> tuple[list[str], list[str]]:
    text = next(s for s in SECTIONS if s.startswith(title))
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    shown = re.findall(r"prints\n\n```text\n(.*?)```", text, flags=re.S)
    return code, shown


@pytest.mark.slow
@pytest.mark.parametrize("title", ["PyTorch Lightning", "Hugging Face"])
def test_the_example_runs_and_prints_what_the_doc_shows(title, tmp_path, capsys):
    code, shown = _section(title)
    assert code and shown
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        namespace: dict = {}
        for block in code:
            exec(compile(block, str(DOC), "exec"), namespace)
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    for expected in shown:
        assert expected.strip() in out
    if title == "PyTorch Lightning":  # the resume example's inline output
        assert "[8, 9, 10, 11] [None, 8]" in out
        from stepscope.cli import main

        assert main(["verify", str(tmp_path / "runs/lightning/stepscope/version_0")]) == 0

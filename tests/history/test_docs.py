"""The examples in docs/history.md run, in order, as one script."""

import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "history.md"


def test_every_python_example_in_the_history_docs_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    torch.manual_seed(0)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "presence_payload_forbidden" in out
    assert "ring_capacity_exhausted" in out
    assert "7 [(0, 7), (8, 8), (9, 9)]" in out
    assert "[128.]" in out

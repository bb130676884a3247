"""The README: a newcomer's first screen, and its quickstart runs and prints what it says.

The quickstart's numbers are checked against an independent replay: the same seeded model and
data trained again without stepscope, a plain forward hook counting the ReLU's exact zeros.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: Relative links to files another branch adds, and whose.
PENDING_LINKS: dict[str, str] = {
    "docs/forensics.md": "h34 (spike forensics) writes it",
}


def _quickstart() -> str:
    return re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)


def test_the_first_screen_is_what_a_newcomer_needs():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 150
    first = "\n".join(lines[:75])  # about a screen and a half
    assert lines[0] == "# stepscope" and "PyTorch" in lines[2]
    assert re.search(r"^pip install stepscope", first, re.M)
    assert first.index("```python") < first.index("stepscope show") < first.index("make demo")
    assert re.search(r"^stepscope show ", first, re.M) and re.search(
        r"^stepscope report ", first, re.M
    )
    make = re.findall(r"^make (\w+)", first, re.M)
    assert make == ["demo", "test"]  # exactly the two set-up commands
    table = [ln for ln in lines[:75] if ln.startswith("| ") and "](docs/" in ln]
    assert len(table) >= 10
    # the quickstart names its site: a named module, not an index
    assert re.search(r'series\("relu"', _quickstart()) and "relu=nn.ReLU()" in _quickstart()


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert "docs/benchmarks.md" in local and "docs/kernels.md" in local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert missing == [link for link in PENDING_LINKS if link in local and link in missing]


def _replayed_zeros(code: str, seed: int) -> list[int]:
    """Zeros of the ReLU at every step, from the same seeded set-up trained without stepscope."""
    setup = code.split("with ss.HistoryCollector", 1)[0]
    loss_expr = re.search(r"loss = (.*)", code).group(1)
    torch.manual_seed(seed)
    ns: dict[str, object] = {}
    exec(compile(setup, "README.md", "exec"), ns)
    model, opt, data = ns["model"], ns["opt"], ns["data"]
    zeros: list[int] = []
    model.relu.register_forward_hook(lambda m, i, out: zeros.append(int((out == 0).sum())))
    for x, y in data:
        ns.update(x=x, y=y)
        loss = eval(loss_expr, ns)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return zeros


def test_the_quickstart_prints_steps_beside_the_exact_zero_counts_twice(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("STEPSCOPE_DIR", raising=False)  # a newcomer's default: ./runs
    code = _quickstart()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        printed = []
        for seed in (0, 1):  # twice in one directory: a second run is a new version
            torch.manual_seed(seed)
            exec(compile(code, "README.md", "exec"), {})
            printed.append(capsys.readouterr().out)
    finally:
        os.chdir(cwd)
    assert sorted(p.name for p in (tmp_path / "runs" / "mlp").iterdir()) == [
        "version_0",
        "version_1",
    ]
    for seed, out in enumerate(printed):
        assert out.startswith("Series 'relu' activation zero: 2 values at steps 0..10")
        rows = [tuple(map(int, m)) for m in re.findall(r"^\s+(\d+)\s+(\d+)\s*$", out, re.M)]
        zeros = _replayed_zeros(code, seed)
        assert rows == [(0, zeros[0]), (10, zeros[10])]

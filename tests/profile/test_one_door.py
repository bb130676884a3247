"""Exactly one torch.profiler.profile construction site and one grad_fn hook stack in stepscope."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "stepscope"


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def profiler_constructions(source: str) -> list[int]:
    """Line numbers that construct ``torch.profiler.profile`` (any import spelling)."""
    tree = ast.parse(source)
    aliases = {"torch.profiler.profile", "torch.autograd.profiler.profile"}
    module_aliases = {"torch.profiler", "torch.autograd.profiler"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in module_aliases:
            aliases |= {a.asname or a.name for a in node.names if a.name == "profile"}
        if isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.autograd"):
            module_aliases |= {a.asname or a.name for a in node.names if a.name == "profiler"}
        if isinstance(node, ast.Import):
            module_aliases |= {
                a.asname for a in node.names if a.name in module_aliases and a.asname
            }
    aliases |= {f"{m}.profile" for m in module_aliases}
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _dotted(node.func) in aliases
    ]


def grad_fn_hook_sites(source: str) -> list[int]:
    """Lines registering autograd-node hooks: ``.register_prehook(...)`` on anything, or
    ``.register_hook(...)`` on an expression that names a grad_fn or node."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = ast.unparse(node.func.value).lower()
        if node.func.attr == "register_prehook" or (
            node.func.attr == "register_hook" and ("grad_fn" in receiver or "node" in receiver)
        ):
            out.append(node.lineno)
    return out


def scan(finder) -> dict[str, list[int]]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = finder(path.read_text())
        if lines:
            found[str(path.relative_to(PACKAGE))] = lines
    return found


def test_the_scanners_see_every_spelling():
    src = (
        "import torch\nfrom torch.profiler import profile as P\nimport torch.profiler as tp\n"
        "from torch.autograd import profiler\n"
        "a = torch.profiler.profile()\nb = P()\nc = tp.profile()\nd = profiler.profile()\n"
        "e = torch.autograd.profiler.profile()\nf = torch.profiler.record_function('x')\n"
    )
    assert profiler_constructions(src) == [5, 6, 7, 8, 9]
    hooks = "t.grad_fn.register_hook(f)\nnode.register_prehook(g)\nx.register_hook(h)\n"
    assert grad_fn_hook_sites(hooks) == [1, 2]


def test_exactly_one_profiler_construction_site():
    assert scan(profiler_constructions) == {"profile/session.py": [scan_line()]}


def scan_line() -> int:
    source = (PACKAGE / "profile" / "session.py").read_text()
    return next(
        i
        for i, line in enumerate(source.splitlines(), 1)
        if "return torch.profiler.profile(" in line
    )


def test_exactly_one_grad_fn_hook_stack():
    found = scan(grad_fn_hook_sites)
    assert list(found) == ["profile/hooks.py"]
    assert len(found["profile/hooks.py"]) == 2  # the prehook and the hook of one capture

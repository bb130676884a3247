"""``tests`` is a package: test kits are imported as ``tests.<dir>.<kit>``, never through ``sys.path``.

pytest puts the repository root on ``sys.path`` (``pythonpath`` in ``pyproject.toml``); a script
run in a subprocess gets it through ``PYTHONPATH``; a benchmark that imports a test kit runs as
``python -m benchmarks.<name>`` from the root.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYS_PATH_EDITS = {"insert", "append", "extend", "remove", "pop", "clear"}


def test_every_test_folder_is_a_package():
    folders = {p.parent for p in (ROOT / "tests").rglob("*.py")} | {ROOT / "benchmarks"}
    missing = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file())
    assert not missing, missing


def sys_path_edits(source: str) -> list[int]:
    """Lines of ``source`` that change ``sys.path`` (a call of a mutating method, an assignment)."""

    def is_sys_path(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in SYS_PATH_EDITS and is_sys_path(node.func.value):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)):
                    lines.append(node.lineno)
    return lines


def test_no_test_or_benchmark_edits_sys_path():
    files = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    edits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n in sys_path_edits(p.read_text(encoding="utf-8"))
    ]
    assert not edits, edits


def test_the_scan_sees_each_way_of_editing_sys_path():
    source = (
        "import sys\n"
        "sys.path.insert(0, 'x')\n"
        "sys.path.append('x')\n"
        "sys.path += ['x']\n"
        "sys.path[:0] = ['x']\n"
        "sys.path = ['x']\n"
        "env = {'PYTHONPATH': ':'.join(sys.path)}\n"  # reading it is fine
    )
    assert sorted(sys_path_edits(source)) == [2, 3, 4, 5, 6]

"""The import layers of ``stepscope`` (``docs/architecture.md``): no module imports upward.

Every ``import`` and ``from ... import`` in ``src/stepscope`` is checked, at module level and inside
functions (an import hidden in a function is still a dependency). A module may import its own
package, any lower layer, and a peer of its own layer only where :data:`PEERS` says so; the top
layer's members may import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stepscope

SRC = Path(stepscope.__file__).parent

#: Bottom to top. A name is a top-level module or sub-package of ``stepscope``.
LAYERS: list[set[str]] = [
    {
        "errors",
        "progress",
        "denominators",
        "selection",
        "_purity",
        "_version",
        "transfer",
        "codec",
        "defaults",
        "budget",
    },
    {"stats"},
    {"history"},
    {"runlog", "events", "profile"},
    {"collect", "probe", "curvature"},
    {"report"},
    {"demo", "integrations", "cli", "run", "__init__", "__main__"},
]
TOP = len(LAYERS) - 1

#: Imports between peers of one layer (below the top) that are allowed, with the reason.
PEERS: dict[tuple[str, str], str] = {
    ("selection", "errors"): "every module refuses with stepscope.errors",
    ("codec", "errors"): "parse_enum and float_from_json refuse with the caller's code",
    ("curvature", "probe"): "curvature reuses the probe's output selection and layer sequence",
}

RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def unit_of(module: str) -> str | None:
    """The layer unit of a ``stepscope.x.y`` module name (None outside the package)."""
    parts = module.split(".")
    if parts[0] != "stepscope":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(tree: ast.Module, package: list[str]) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``tree``; ``package`` is the importer's."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "stepscope":  # ``from stepscope import x``: x is a unit (or the root's)
                out += [(node.lineno, f"stepscope.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, module))
    return out


def violations(source: str, unit: str, package: list[str], where: str) -> list[str]:
    """Upward (or unlisted peer) imports of one module whose layer unit is ``unit``."""
    found = []
    for line, module in imported_modules(ast.parse(source), package):
        target = unit_of(module)
        if target is None or target == unit:
            continue
        if target not in RANK:  # a name of the package root (e.g. a lazily exported one)
            target = "__init__"
        mine, theirs = RANK[unit], RANK[target]
        if theirs > mine:
            found.append(f"{where}:{line} imports {module} (layer {theirs} > {mine})")
        elif theirs == mine and mine != TOP and (unit, target) not in PEERS:
            found.append(f"{where}:{line} imports its peer {module} (not listed in PEERS)")
    return found


def modules() -> list[tuple[Path, str, list[str]]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        package = ["stepscope", *rel.parts[:-1]]
        out.append((path, rel.parts[0], package))
    return out


def test_every_module_belongs_to_a_layer():
    assert {unit for _, unit, _ in modules()} - set(RANK) == set()


def test_no_module_imports_a_higher_layer():
    found = []
    for path, unit, package in modules():
        found += violations(path.read_text(), unit, package, str(path.relative_to(SRC)))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("source", "unit", "bad"),
    [
        ("from stepscope.runlog import RunView\n", "history", True),
        ("def f():\n    import stepscope.collect.staging as s\n", "runlog", True),
        ("def f():\n    from stepscope import runlog\n", "history", True),
        ("from stepscope import __version__\n", "history", True),  # the root is the top
        ("from ..runlog import x\n", "history", True),
        ("from stepscope.stats import SPINE_WIDTH\n", "history", False),
        ("from .files import read_log\n", "history", False),
        ("from stepscope.profile import scope\n", "runlog", True),  # an unlisted peer
        ("from stepscope.probe.outputs import x\n", "curvature", False),  # a listed peer
        ("from stepscope.report import x\n", "demo", False),
        ("from stepscope.cli import main\n", "integrations", False),  # the top layer
    ],
)
def test_the_checker_sees_upward_imports_at_any_depth(source, unit, bad):
    assert bool(violations(source, unit, ["stepscope", "history"], "x.py")) == bad

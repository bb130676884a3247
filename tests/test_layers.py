"""The import layers of ``stepscope`` (``docs/architecture.md``): no module imports upward.

Every ``import`` and ``from ... import`` in ``src/stepscope`` is checked, at module level and inside
functions (an import hidden in a function is still a dependency). A module may import its own
package, any lower layer, and a peer of its own layer only where :data:`PEERS` says so; the top
layer's members may import each other.

The bottom of the numeric stack, ``stepscope.stats.layout`` (the spine row layout and its merge),
and everything ``stepscope.history`` imports at module level are free of torch: reading a run
needs numpy only. An AST walk names the line that would break it; a subprocess with ``torch``
made unimportable proves it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
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
        "stephooks",
    },
    {"stats"},  # stats.layout (torch-free) is what history builds on, imported at module level
    {"history"},
    {"runlog", "events", "profile"},
    {"collect", "probe", "curvature", "forensics"},
    {"run"},  # the one reader (history + run log + flight recorder); the report reads Runs
    {"report"},
    {"demo", "integrations", "cli", "__init__", "__main__"},
]
TOP = len(LAYERS) - 1

#: Imports between peers of one layer (below the top) that are allowed, with the reason.
PEERS: dict[tuple[str, str], str] = {
    ("selection", "errors"): "every module refuses with stepscope.errors",
    ("codec", "errors"): "parse_enum and float_from_json refuse with the caller's code",
    ("curvature", "probe"): "curvature reuses the probe's output selection and layer sequence",
    ("collect", "forensics"): "the collector runs the flight recorder (spike forensics)",
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
        ("from stepscope.runlog import RunLog\n", "history", True),
        ("def f():\n    import stepscope.collect.staging as s\n", "runlog", True),
        ("def f():\n    from stepscope import runlog\n", "history", True),
        ("from stepscope import __version__\n", "history", True),  # the root is the top
        ("from ..runlog import x\n", "history", True),
        ("from stepscope.stats import SPINE_WIDTH\n", "history", False),
        ("from stepscope.stats.layout import merge_spine_rows\n", "history", False),
        ("from stepscope.history import HistoryWriter\n", "stats", True),
        ("from .files import read_log\n", "history", False),
        ("from stepscope.profile import scope\n", "runlog", True),  # an unlisted peer
        ("from stepscope.probe.outputs import x\n", "curvature", False),  # a listed peer
        ("from stepscope.report import x\n", "demo", False),
        ("from stepscope.run import Run\n", "report", False),  # the report reads Runs
        ("from stepscope.report import x\n", "run", True),
        ("from stepscope.cli import main\n", "integrations", False),  # the top layer
    ],
)
def test_the_checker_sees_upward_imports_at_any_depth(source, unit, bad):
    assert bool(violations(source, unit, ["stepscope", "history"], "x.py")) == bad


# ---------------------------------------------------------------------------------- torch-free

#: Where the torch-free part of the package starts: every module it imports at module level
#: (transitively, package ``__init__``s included) must not import torch at module level.
TORCH_FREE_ROOTS = ["stepscope.stats.layout", "stepscope.history", "stepscope.run"]


def module_file(module: str) -> Path | None:
    """The source file of a ``stepscope`` module (None if it is not one)."""
    rel = Path(*module.split(".")[1:])
    for path in (SRC / rel / "__init__.py", (SRC / rel).with_suffix(".py")):
        if path.is_file():
            return path
    return None


def import_time_imports(tree: ast.Module, package: list[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of the imports that run when the module is imported: module level,
    class bodies, ``if``/``try``/``with`` blocks, not function bodies, not ``if TYPE_CHECKING``."""
    found: list[tuple[int, str]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                visit(node.orelse)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.extend(imported_modules(ast.Module(body=[node], type_ignores=[]), package))
                if isinstance(node, ast.ImportFrom):  # ``from pkg import submodule``
                    base = found[-1][1]
                    found.extend((node.lineno, f"{base}.{a.name}") for a in node.names)
                continue
            for field in ("body", "orelse", "finalbody"):  # class, if, try, with, loops
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    visit(inner)
            for handler in getattr(node, "handlers", []):  # ``except ImportError:`` blocks
                visit(handler.body)

    visit(tree.body)
    return found


def torch_imports_at_import_time(roots: list[str]) -> list[str]:
    """``module:line`` of each import-time ``import torch`` reachable from ``roots``."""
    todo = list(roots)
    for root in roots:  # a package root brings every one of its modules
        path = module_file(root)
        if path is not None and path.name == "__init__.py":
            todo += [
                ".".join(["stepscope", *p.relative_to(SRC).with_suffix("").parts])
                for p in path.parent.glob("*.py")
                if p.name != "__init__.py"
            ]
    seen: set[str] = set()
    bad: list[str] = []
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for k in range(1, len(parts) + 1):  # importing a.b.c imports a and a.b first
            name = ".".join(parts[:k])
            path = module_file(name)
            if path is None or name in seen:
                continue
            seen.add(name)
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            for line, imported in import_time_imports(ast.parse(path.read_text()), package):
                if imported.split(".")[0] == "torch":
                    bad.append(f"{path.relative_to(SRC)}:{line} imports {imported}")
                elif imported.startswith("stepscope"):
                    todo.append(imported)
    return bad


def test_history_and_the_stats_layout_import_no_torch_at_import_time():
    assert torch_imports_at_import_time(TORCH_FREE_ROOTS) == []


def test_the_torch_free_walk_sees_an_import_behind_a_chain():
    """The walk itself finds torch behind stats/__init__ -> reduce (it is not vacuous)."""
    found = torch_imports_at_import_time(["stepscope.stats.reduce"])
    assert any(f.startswith("stats/reduce.py") and f.endswith("imports torch") for f in found)


def test_history_reads_a_run_in_a_process_where_torch_cannot_be_imported(tmp_path):
    """``sys.modules['torch'] = None`` makes ``import torch`` fail: the history, the stats layout
    and the value classes still import, and a run written here opens and decodes there."""
    import numpy as np

    from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
    from stepscope.stats import SPINE_WIDTH, HistogramDescriptor

    path = tmp_path / "run"
    d = HistogramDescriptor()
    with HistoryWriter(path) as w:
        site = w.register_site("fc1", "torch.nn.Linear", "f32[4]")
        spine = np.zeros((1, SPINE_WIDTH))
        spine[0, :2] = 4  # total, finite
        spine[0, 7:] = [1.0, 4.0, 4.0, 10.0, 30.0, 10.0, 2.5, 5.0]
        hist = np.zeros((1, d.width), dtype=np.int64)
        hist[0, d.n_bins] = 4
        b = ObservationBatch.observed(
            "activation", "forward", [site], spine, hist_rows=[0], histograms=hist
        )
        w.write_step(StepBlockRecord(0), [b])
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any import of torch now raises ImportError
        import stepscope.history, stepscope.stats.layout, stepscope.stats
        import stepscope as ss
        h = ss.open_run({str(path)!r})
        (rec,) = h.observations()
        print(h.series("fc1", "activation", "mean").values.tolist(), rec.spine.m2,
              rec.histogram.total, type(rec.spine).__name__)
        try:
            stepscope.stats.reduce_spines
        except ImportError:
            print("reductions need torch")
        assert "torch" not in [m.split(".")[0] for m in sys.modules if sys.modules[m]]
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[2.5] 5.0 4 RunningStats", "reductions need torch"]

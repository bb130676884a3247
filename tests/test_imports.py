"""Imports in ``src/stepscope``: at the top of the module, from the module that defines the name.

An import inside a function is allowed only with its reason on its line, ``# lazy: <reason>``
(an import cycle, keeping ``import stepscope`` / ``stepscope --help`` or the history free of torch,
an optional extra). A module other than a package ``__init__`` re-exports nothing: a name is
imported from the module that defines it, and a module's ``__all__`` lists only its own names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stepscope

SRC = Path(stepscope.__file__).parent

#: ``path:line`` of in-function imports still without a ``# lazy:`` reason (collect/, being
#: restructured); empty it as they are fixed — a listed entry no longer an offender fails too.
PENDING_LAZY: set[str] = set()

#: ``path: module.name`` of imports that still name a re-exporting module, and modules whose
#: ``__all__`` still lists a name defined elsewhere (none: keep it empty).
PENDING_REEXPORTS: set[str] = set()


def _sources() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(SRC)), path.read_text(encoding="utf-8"))
        for path in sorted(SRC.rglob("*.py"))
    ]


def unexplained_lazy_imports(source: str, where: str) -> list[str]:
    """``where:line`` of each import inside a function whose lines carry no ``# lazy:``."""
    lines = source.splitlines()
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                text = "\n".join(lines[node.lineno - 1 : node.end_lineno])
                if "# lazy:" not in text:
                    found.append(f"{where}:{node.lineno}")
    return sorted(set(found))


def test_every_import_inside_a_function_says_why_it_is_lazy():
    found = {hit for where, source in _sources() for hit in unexplained_lazy_imports(source, where)}
    assert found - PENDING_LAZY == set(), "\n".join(sorted(found - PENDING_LAZY))
    assert PENDING_LAZY - found == set(), "fixed: remove from PENDING_LAZY"


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("def f():\n    from stepscope.history import find_runs\n", True),
        ("def f():\n    import stepscope.report as r\n", True),
        ("def f():\n    from . import x\n", True),
        ("def f():\n    import numpy\n", True),
        ("def f():\n    from stepscope.stats.reduce import x  # lazy: imports torch\n", False),
        (
            "def f():\n    from stepscope.a import (\n        x,  # lazy: import cycle\n    )\n",
            False,
        ),
        ("class C:\n    def m(self):\n        from stepscope import errors\n", True),
        ("from stepscope.history import find_runs\n", False),
    ],
)
def test_the_lazy_check_sees_imports_at_any_depth(source, bad):
    assert bool(unexplained_lazy_imports(source, "x.py")) == bad


def _module_names(rel: str) -> list[str]:
    parts = list(Path(rel).with_suffix("").parts)
    return ["stepscope", *parts[:-1]] if parts[-1] == "__init__" else ["stepscope", *parts]


class _Module:
    """What one module defines and what it imports at its top level."""

    def __init__(self, tree: ast.Module, is_package: bool):
        self.is_package = is_package
        self.defined: set[str] = set()
        self.imported: set[str] = set()
        self.all: list[str] = []
        for node in tree.body:
            for inner in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.defined.add(inner.name)
                elif isinstance(inner, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                    for target in targets:
                        self.defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                    if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                        value = inner.value
                        if isinstance(value, (ast.List, ast.Tuple)):
                            self.all = [e.value for e in value.elts if isinstance(e, ast.Constant)]
                elif isinstance(inner, (ast.Import, ast.ImportFrom)):
                    self.imported |= {(a.asname or a.name).split(".")[0] for a in inner.names}


def _modules() -> dict[str, _Module]:
    out = {}
    for rel, source in _sources():
        out[".".join(_module_names(rel))] = _Module(ast.parse(source), rel.endswith("__init__.py"))
    return out


def reexport_findings() -> set[str]:
    """Imports of a name from a module that only imports it (not a package ``__init__``), and
    ``__all__`` entries of a module that does not define them."""
    modules = _modules()
    found = set()
    for rel, source in _sources():
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            target = modules.get(node.module)
            if target is None or target.is_package:
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}" in modules
                if alias.name not in target.defined and not submodule:
                    found.add(f"{rel}: {node.module}.{alias.name}")
    for rel, _ in _sources():
        module = modules[".".join(_module_names(rel))]
        if not module.is_package:
            found |= {f"{rel}: __all__ {name}" for name in module.all if name not in module.defined}
    return found


def test_names_are_imported_from_the_module_that_defines_them():
    found = reexport_findings()
    assert found - PENDING_REEXPORTS == set(), "\n".join(sorted(found - PENDING_REEXPORTS))
    assert PENDING_REEXPORTS - found == set(), "fixed: remove from PENDING_REEXPORTS"

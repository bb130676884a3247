"""Type checkers see stepscope's public names: mypy over the README and docs examples.

``import stepscope as ss`` resolves names lazily at run time; the ``TYPE_CHECKING`` imports in
``stepscope/__init__.py`` give mypy the same names with their real types. One mypy run (a subprocess,
cached in ``.mypy_cache``) checks every ``python`` block of ``README.md`` and
``docs/*.md`` and a small probe that must fail (a misspelt name) and reveal real types.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stepscope

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "src" / "stepscope" / "__init__.py"

pytest.importorskip("mypy")

#: Docs blocks with type errors in areas this test does not own, and why. A block that starts to
#: check clean fails the test until it is removed here; a new failing block fails it too.
KNOWN_TYPE_ERRORS: dict[str, str] = {}

PROBE = """\
import pathlib
import stepscope as ss
reveal_type(ss.HistoryCollector)
reveal_type(ss.RunLog)
reveal_type(ss.AutoCadence)
reveal_type(ss.draw)
ss.NoSuchThing
ss.WatchSettings(output_dir=pathlib.Path("runs/a"))
"""

#: docs blocks are fragments that reuse names from the prose (model, x, loader)
FRAGMENT = '# mypy: disable-error-code="name-defined"\n'


def python_blocks() -> dict[str, str]:
    """``{name: code}`` for every fenced python block of the README and the docs."""
    out = {}
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = re.findall(r"```python\n(.*?)```", md.read_text(), re.S)
        for i, code in enumerate(blocks):
            out[f"{md.stem}_{i}"] = code
    return out


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory) -> dict[str, list[str]]:
    """Error and note lines per checked file stem, from one mypy run."""
    folder = tmp_path_factory.mktemp("typed_examples")
    files = {"typing_probe": PROBE}
    for name, code in python_blocks().items():
        files[name] = code if name.startswith("README") else FRAGMENT + code
    for name, code in files.items():
        (folder / f"{name}.py").write_text(code)
    # a subprocess, not mypy.api in this process: mypy's object graph (GBs) would otherwise stay
    # alive to the end of the suite and take a minute of garbage collection at interpreter exit
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--follow-imports=silent",  # check the examples; the package has its own run
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--no-error-summary",
            *sorted(str(folder / f"{n}.py") for n in files),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    out: dict[str, list[str]] = {name: [] for name in files}
    for line in (done.stdout + done.stderr).splitlines():
        stem = Path(line.split(":", 1)[0]).stem
        if stem in out:
            out[stem].append(line)
    return out


def test_type_checking_imports_name_exactly_the_lazy_exports():
    tree = ast.parse(INIT.read_text())
    guarded = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    typed = {a.asname or a.name for imp in guarded.body for a in imp.names}  # type: ignore[attr-defined]
    assert typed == set(stepscope._EXPORTS)
    for name in stepscope._EXPORTS:  # and each resolves at run time
        assert getattr(stepscope, name) is not None


def test_readme_example_type_checks(mypy_errors):
    assert "README_0" in mypy_errors
    assert not [ln for ln in mypy_errors["README_0"] if ": error:" in ln], mypy_errors["README_0"]


def test_docs_examples_type_check(mypy_errors):
    failing = {
        name
        for name, lines in mypy_errors.items()
        if name not in ("README_0", "typing_probe") and any(": error:" in ln for ln in lines)
    }
    assert failing == set(KNOWN_TYPE_ERRORS), {n: mypy_errors[n] for n in failing}


def test_a_misspelt_name_is_an_error_and_public_names_have_real_types(mypy_errors):
    lines = mypy_errors["typing_probe"]
    errors = [ln for ln in lines if ": error:" in ln]
    assert len(errors) == 1 and 'Module has no attribute "NoSuchThing"' in errors[0]  # Path ok
    notes = "\n".join(lines)
    assert "stepscope.collect.collector.HistoryCollector" in notes
    assert "stepscope.runlog.runlog.RunLog" in notes
    assert "stepscope.collect.cadence.AutoCadence" in notes
    assert "def (result: stepscope.profile.results.ProfileResult" in notes

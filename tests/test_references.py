"""Every reference a reader meets in the repository resolves inside it.

Comments, docstrings and docs may not point at things only their author could see: an issue or a
review finding by its number in some tracker, a task file by its seed number, a Markdown file or a
repository path that is not in this checkout, a relative path that climbs out of it. An outside reference is spelled so it
resolves anywhere (``https://github.com/owner/repo/issues/N`` or ``owner/repo#N``); an inside one
names the file from the repository root (``docs/LEGACY_METRICS.md``), or from the Markdown file's
own folder for a link in ``docs/``.

Scanned: comments and docstrings of every ``.py`` file under ``src``, ``tests``, ``benchmarks``
and ``examples`` (and every string literal under ``src``: refusal messages and remedies are read
by users), the text of ``src/**/*.c``, ``docs/**/*.md``, ``README.md``, ``Makefile``,
``pyproject.toml`` and ``setup.py``.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (what is wrong, pattern); a match is a finding unless the rule's check below lets it pass
TRACKER = [
    ("a tracker's issue number", re.compile(r"\bissues? #?\d+", re.I)),
    ("a review's finding number", re.compile(r"\bfindings? #?\d+", re.I)),
    ("a task file's seed number", re.compile(r"\bseeds? `?0\d\d(?!\d)", re.I)),
    ("a document only the author has", re.compile(r"\bthe (brief|lead)\b", re.I)),
]
MARKDOWN = re.compile(r"(?<![\w./-])([\w./-]*\w\.md)\b")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:src|docs|tests|benchmarks|examples)/[\w./-]*\."
    r"(?:py|md|c|h|toml|json|txt|sh|cfg|ya?ml|gz|png|svg|html))\b"
)
CLIMB = re.compile(r"(?<![\w./-])((?:\.\./)+[\w.-][\w./-]*)")


def _resolves(ref: str, source: Path, root: Path) -> bool:
    """``ref`` exists inside ``root``, named from the root or from ``source``'s folder."""
    for base in (root, source.parent):
        target = (base / ref).resolve()
        if target.is_relative_to(root.resolve()) and target.exists():
            return True
    return False


def _python_text(path: Path, all_strings: bool) -> list[tuple[int, str]]:
    """(line, text) of the comments and docstrings of ``path`` (every string if ``all_strings``)."""
    source = path.read_text(encoding="utf-8")
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if all_strings:
                out.append((node.lineno, node.value))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str):  # a docstring or an attribute docstring
                out.append((node.lineno, node.value.value))
    return out


def _lines(text: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(n + i, line) for n, chunk in text for i, line in enumerate(chunk.splitlines())]


def unresolvable(path: Path, root: Path = ROOT) -> list[str]:
    """Each reference in ``path`` that a reader of the repository cannot resolve, as text."""
    if path.suffix == ".py":
        text = _python_text(path, all_strings=path.resolve().is_relative_to(root / "src"))
    else:
        text = [(1, path.read_text(encoding="utf-8"))]
    where = path.relative_to(root) if path.is_relative_to(root) else path
    found = []
    for n, line in _lines(text):
        for what, pattern in TRACKER:
            found += [f"{where}:{n}: {what}: {m.group(0)!r}" for m in pattern.finditer(line)]
        for pattern in (MARKDOWN, REPO_PATH, CLIMB):
            for m in pattern.finditer(line):
                ref = m.group(1)
                if "*" not in ref and not _resolves(ref, path, root):
                    found.append(f"{where}:{n}: not in the repository: {ref!r}")
    return list(dict.fromkeys(found))  # a path can match two patterns


def scanned_files(root: Path = ROOT) -> list[Path]:
    files = [root / name for name in ("README.md", "Makefile", "pyproject.toml", "setup.py")]
    files += sorted((root / "src").rglob("*.c")) + sorted((root / "docs").rglob("*.md"))
    for folder in ("src", "tests", "benchmarks", "examples"):
        files += sorted((root / folder).rglob("*.py"))
    return [f for f in files if f.is_file() and ".egg-info" not in str(f)]


def test_every_reference_in_comments_docstrings_and_docs_resolves():
    files = scanned_files()
    assert len(files) > 100 and ROOT / "src" / "stepscope" / "__init__.py" in files
    found = [f for path in files for f in unresolvable(path)]
    assert not found, "\n".join(found)


CASES = [
    ("# written for issue 4\n", "issue"),
    ("# see Issue #12\n", "issue"),
    ('"""Regression test (finding 9)."""\n', "finding"),
    ("x = 1  # the probe of seed 004\n", "seed"),
    ("# Seed `004_4b8a479150a75278.txt` audits a script\n", "seed"),
    ('"""Facts from ``ECOSYSTEM.md``."""\n', "ECOSYSTEM.md"),
    ("# the numbers are in docs/NO_SUCH_PAGE.md\n", "NO_SUCH_PAGE.md"),
    ("# run benchmarks/no_such_bench.py\n", "no_such_bench.py"),
    ("# traces in ../shared/fixtures/kineto\n", "../shared"),
    ("# as the brief says\n", "the brief"),
]


@pytest.mark.parametrize(("source", "named"), CASES)
def test_the_scan_finds_each_kind_of_unresolvable_reference(tmp_path, source, named):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "history.md").write_text("# history\n")
    mod = tmp_path / "mod.py"
    mod.write_text(source)
    found = unresolvable(mod, tmp_path)
    assert len(found) == 1 and named in found[0], found


def test_resolvable_references_and_code_pass(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "history.md").write_text("see [the runlog](runlog.md)\n")
    (tmp_path / "docs" / "runlog.md").write_text("back to [README](../README.md)\n")
    (tmp_path / "README.md").write_text("see docs/history.md and docs/*.md\n")
    (tmp_path / "tests").mkdir()
    mod = tmp_path / "tests" / "mod.py"
    mod.write_text(
        '"""The limits of docs/history.md; torch bug pytorch/pytorch#124388, seed 0, seed 101."""\n'
        'DOC = "NO_SUCH_PAGE.md"  # a string in a test is code, not a reference\n'
        "# https://github.com/pytorch/pytorch/issues/124388 and ../README.md\n"
    )
    for path in (mod, *(tmp_path / "docs").iterdir(), tmp_path / "README.md"):
        assert unresolvable(path, tmp_path) == []
    src = tmp_path / "src" / "m.py"
    src.parent.mkdir()
    src.write_text('raise ValueError("see NO_SUCH_PAGE.md")\n')  # messages under src are read
    assert len(unresolvable(src, tmp_path)) == 1

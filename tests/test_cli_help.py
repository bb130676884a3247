"""``stepscope --help``: exit codes documented, every option explained, every command an example."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.cli import COMMANDS, build_parser, main
from stepscope.history import HistoryWriter, RunRecord


def _action(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    return dict(_action(build_parser(every=True)).choices)


def _imports_after(code: str, cwd: Path | None = None) -> list[str]:
    """The heavy modules (torch, matplotlib, the trainer) a fresh interpreter holds after ``code``."""
    probe = textwrap.dedent(code) + textwrap.dedent("""
        import sys
        heavy = ("torch", "matplotlib", "stepscope.collect", "stepscope.demo", "stepscope.report")
        print("HEAVY", sorted({m for m in sys.modules for h in heavy if m == h}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=cwd, check=False
    )
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("HEAVY"))
    return ast.literal_eval(line.split(" ", 1)[1])


def test_top_level_help_imports_no_area(tmp_path):
    heavy = _imports_after("""
        from stepscope.cli import main
        try:
            main(["--help"])
        except SystemExit as done:
            assert done.code == 0
    """)
    assert heavy == []


def test_show_and_verify_of_a_run_read_it_without_torch(tmp_path):
    with HistoryWriter(tmp_path / "runs" / "a", RunRecord.new(run_id="a")) as writer:
        writer.write_scalar("loss", 0, 1.5)
    heavy = _imports_after(
        """
        from stepscope.cli import main
        assert main(["show", "runs"]) == 0
        assert main(["show", "runs/a", "--json"]) == 0
        assert main(["verify", "runs"]) == 0
        """,
        cwd=tmp_path,
    )
    assert heavy == []


def test_the_help_summary_of_each_command_is_the_one_its_area_registers():
    listed = {a.dest: a.help for a in _action(build_parser())._choices_actions}
    built = {a.dest: a.help for a in _action(build_parser(every=True))._choices_actions}
    assert listed == built == {name: summary for name, (_, summary) in COMMANDS.items()}


def test_top_level_help_documents_every_exit_code(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes:" in out
    lines = out.split("exit codes:", 1)[1].splitlines()
    for code, word in ((0, "success"), (1, "failure"), (2, "usage"), (3, "refused"), (5, "budget")):
        assert any(ln.startswith(f"  {code}  ") and word in ln for ln in lines), code


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_option_has_help_and_every_command_an_example(name, capsys):
    sub = _subcommands()[name]
    undocumented = [
        a.option_strings or [a.dest]
        for a in sub._actions
        if not isinstance(a, argparse._HelpAction) and not a.help
    ]
    assert undocumented == []
    text = sub.format_help()
    assert "examples:" in text and f"stepscope {name}" in text.split("examples:", 1)[1]


def test_a_refusal_exits_3_and_usage_exits_2(tmp_path, capsys):
    assert main(["show", str(tmp_path / "missing")]) == 3
    assert "refused [history_artifact_missing]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["show"])
    assert done.value.code == 2

"""``stepscope --help``: exit codes documented, every option explained, every command an example."""

from __future__ import annotations

import argparse

import pytest

from stepscope.cli import build_parser, main


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


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

"""``stepscope demo`` runs end to end and prints what it measured."""

import subprocess
import sys

import pytest

from stepscope.cli import main


def test_quick_demo_prints_spines_and_histogram(tmp_path, capsys):
    pytest.importorskip("mlxtend")
    assert main(["demo", "--quick", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "activation spines" in out and "0 (exact)" in out
    assert "validation loss" in out
    assert (tmp_path / "run").is_dir()


def test_module_entry_point_lists_commands():
    res = subprocess.run(
        [sys.executable, "-m", "stepscope", "--help"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0 and "demo" in res.stdout


def test_invalid_configuration_refuses_with_exit_code_3(tmp_path, capsys):
    assert main(["demo", "--epochs", "0", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "run_config_invalid" in err

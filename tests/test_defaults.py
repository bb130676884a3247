"""One default seed: ``stepscope.defaults.DEFAULT_SEED`` is the only seed literal in the package,
and every seeded public entry point defaults to it."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import stepscope
from stepscope.collect import WatchSettings
from stepscope.curvature import cli as curvature_cli
from stepscope.curvature.analyze import analyze_curvature
from stepscope.curvature.eigen import top_eigenvalues
from stepscope.curvature.estimators import trace
from stepscope.curvature.offline import run_curvature_panel
from stepscope.curvature.quadratic import directional
from stepscope.defaults import DEFAULT_SEED
from stepscope.probe.dense import DenseProbe
from stepscope.probe.selection import select_probe

SRC = Path(stepscope.__file__).parent


def test_the_seed_literal_is_written_once():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value == DEFAULT_SEED:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert len(found) == 1 and found[0].startswith("defaults.py:"), found


@pytest.mark.parametrize(
    "function",
    [analyze_curvature, run_curvature_panel, trace, directional, top_eigenvalues, select_probe],
)
def test_seeded_functions_default_to_the_one_seed(function):
    assert inspect.signature(function).parameters["seed"].default == DEFAULT_SEED


def test_probe_settings_and_command_line_default_to_the_one_seed():
    assert inspect.signature(DenseProbe).parameters["seed"].default == DEFAULT_SEED
    fields = {f.name: f.default for f in dataclasses.fields(WatchSettings)}
    assert fields["update_seed"] == DEFAULT_SEED
    parser = argparse.ArgumentParser()
    curvature_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["curvature", *_required_curvature_args(parser)])
    assert args.seed == DEFAULT_SEED


def _required_curvature_args(parser: argparse.ArgumentParser) -> list[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = []
    for action in sub.choices["curvature"]._actions:
        if action.required:
            out += [action.option_strings[0], "x"] if action.option_strings else ["x"]
    return out

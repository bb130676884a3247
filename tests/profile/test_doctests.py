"""The docstring examples of stepscope.profile run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import stepscope.profile as package

MODULES = sorted(
    name for _, name, _ in pkgutil.iter_modules(package.__path__, package.__name__ + ".")
)


@pytest.mark.parametrize("name", [package.__name__, *MODULES])
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write here
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert failures == 0

"""The docstring examples of stepscope.events run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import warnings

import pytest

import stepscope.events as package

MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
)


@pytest.mark.parametrize("name", [package.__name__, *MODULES])
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write here
    module = importlib.import_module(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # examples that trigger a check's warning
        failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert failures == 0


def test_top_level_names_resolve_to_the_events_package():
    import stepscope as ss

    assert ss.EventStream is package.EventStream
    assert ss.ObserverEvent is package.ObserverEvent

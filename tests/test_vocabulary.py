"""Distinct names for distinct things: a public name exported by two modules is one object.

Every module's ``__all__`` (or, without one, the classes and functions it defines) is collected;
a name that two modules export must be the same object, unless :data:`SAME_ROLE` lists it with its
reason (one role filled once per module, on purpose). The other direction, one concept spelled
twice, is checked for the vocabularies this was written for: the collector's streams are the
history's :class:`~stepscope.history.vocab.Stream`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import defaultdict

import pytest

import stepscope

#: Names that several modules define on purpose, with the reason.
SAME_ROLE: dict[str, str] = {
    "register": "each command module's hook that adds its sub-commands to the one parser",
    "StepscopeCallback": "one trainer callback per integration (SPEC: lightning, transformers)",
    "gradient_moments": "probe (from squared norms) and curvature (from per-layer factors) "
    "compute the same moments from different inputs; left as found, see the report of issue 15",
    "merge_spine_rows": "stats.reduce's kernel and history.merge's dtype-checking wrapper "
    "(the stats layout work owns both)",
}


def exported() -> dict[str, dict[int, str]]:
    found: dict[str, dict[int, str]] = defaultdict(dict)
    for info in pkgutil.walk_packages(stepscope.__path__, "stepscope."):
        if info.name.endswith("__main__") or info.name.endswith("_stepscope_kernels"):
            continue
        module = importlib.import_module(info.name)
        names = getattr(module, "__all__", None)
        for name in names if names is not None else [n for n in vars(module) if n[0] != "_"]:
            obj = getattr(module, name, None)
            if not (isinstance(obj, type) or callable(obj)):
                continue
            if names is None and getattr(obj, "__module__", None) != module.__name__:
                continue  # an import, not a definition
            found[name][id(obj)] = info.name
    return found


def test_one_public_name_is_one_thing():
    clashes = {
        name: sorted(where.values())
        for name, where in exported().items()
        if len(where) > 1 and name not in SAME_ROLE
    }
    assert not clashes


def test_the_collector_streams_are_the_history_streams():
    from stepscope import collect
    from stepscope.history.vocab import Stream

    assert collect.ALL_STREAMS == tuple(s.value for s in Stream)
    assert not hasattr(collect, "StreamName")


def test_ram_policy_accepts_the_enum_and_its_spellings_and_stores_the_enum():
    from stepscope import Refusal
    from stepscope.collect import WatchSettings
    from stepscope.history.ring import RingPolicy, StepRing

    for policy in RingPolicy:
        for given in (policy, policy.value):
            stored = WatchSettings(ram_policy=given).ram_policy
            assert stored is policy and StepRing(4, stored).policy is policy
    assert WatchSettings().ram_policy is RingPolicy.REFUSE
    with pytest.raises(Refusal) as err:
        WatchSettings(ram_policy="shed")
    assert err.value.code == "settings_invalid" and "drop_oldest" in err.value.message

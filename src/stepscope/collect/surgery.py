"""Model surgery: find selected modules and parameters that were replaced or removed.

The collector binds each row to an object (a module, a parameter). Before a step's first
forward it asks :func:`find_changes` whether the model still holds those objects under the
same qualified names; a replaced object ends its series (``ended_reason`` ``module_replaced``,
``parameter_replaced``, ``module_removed`` or ``parameter_removed``) and, when a replacement
exists, a new series starts on it.

Example
-------
>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
>>> bound = {"0": m[0]}
>>> m[0] = torch.nn.Linear(2, 2)
>>> [(c.name, c.reason) for c in find_changes(m, bound, [])]
[('0', 'module_replaced')]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stepscope.collect.sites import ROOT_SITE, Row


@dataclass(frozen=True)
class Change:
    """One replaced or removed object: its name, why, and the replacement (``None``: gone)."""

    name: str
    reason: str
    replacement: Any


def _lookup(model: torch.nn.Module, name: str) -> torch.nn.Module | None:
    if name in ("", ROOT_SITE):
        return model
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def find_changes(
    model: torch.nn.Module, modules: Mapping[str, torch.nn.Module], param_rows: Sequence[Row]
) -> list[Change]:
    """Modules (by qualified name) and parameter rows no longer bound to the same object."""
    out = []
    for name, module in modules.items():
        now = _lookup(model, name)
        if now is not module:
            out.append(Change(name, "module_removed" if now is None else "module_replaced", now))
    seen = set()
    for r in param_rows:
        if r.site in seen or r.param is None or r.attr is None:
            continue
        seen.add(r.site)
        now = r.module._parameters.get(r.attr)
        if now is not r.param:
            reason = "parameter_removed" if now is None else "parameter_replaced"
            out.append(Change(r.site, reason, now))
    return out

"""Model surgery: find selected modules and parameters that were replaced or removed.

The collector binds each row to an object (a module, a parameter). Before the first forward
of a step on which some stream is due it asks :func:`find_changes` whether the model still
holds those objects under the same qualified names (a step with nothing due records no row, so
a change made then is found at the next step that records); a replaced object ends its site (``ended_reason`` ``module_replaced``,
``parameter_replaced``, ``module_removed`` or ``parameter_removed``) and, when a replacement
exists, a new site starts on it.

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

from stepscope.collect.sites import ROOT_SITE, SiteRow, param_signature, update_indices


@dataclass(frozen=True)
class Change:
    """One replaced or removed object: its name, why, and the replacement (``None``: gone)."""

    name: str
    reason: str
    replacement: Any


def _lookup(model: torch.nn.Module, name: str) -> torch.nn.Module | None:
    if name in ("", ROOT_SITE):
        return model
    module: torch.nn.Module | None = model
    for part in name.split("."):  # plain dict lookups: this runs once a step per module
        module = module._modules.get(part)  # type: ignore[union-attr]
        if module is None:
            return None
    return module


def find_changes(
    model: torch.nn.Module, modules: Mapping[str, torch.nn.Module], param_rows: Sequence[SiteRow]
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
        param_now = r.module._parameters.get(r.attr)
        if param_now is not r.param:
            reason = "parameter_removed" if param_now is None else "parameter_replaced"
            out.append(Change(r.site, reason, param_now))
    return out


def identity_edges(
    model: torch.nn.Module, modules: Mapping[str, torch.nn.Module], param_rows: Sequence[SiteRow]
) -> list[tuple[dict[str, Any], str, Any]]:
    """``(holder, key, object)`` triples that hold exactly when :func:`find_changes` finds none.

    One triple per link of the module tree between ``model`` and each bound module (a
    ``_modules`` dict, the child's name, the child found there now) and per parameter row (its
    module's ``_parameters``, the attribute, the parameter). Each link is looked at once, where
    :func:`find_changes` walks every qualified name from the root; when a triple no longer
    holds, :func:`find_changes` says what changed. Empty when something is already missing.
    """
    edges: list[tuple[dict[str, Any], str, Any]] = []
    seen: set[str] = set()
    for name in modules:
        if name in ("", ROOT_SITE):
            continue
        parent: torch.nn.Module = model
        path = ""
        for part in name.split("."):
            path = f"{path}.{part}" if path else part
            child = parent._modules.get(part)
            if child is None:
                return [({}, "", model)]  # already gone: never holds, find_changes reports it
            if path not in seen:
                seen.add(path)
                edges.append((parent._modules, part, child))
            parent = child
    sites: set[str] = set()
    for r in param_rows:
        if r.site in sites or r.param is None or r.attr is None:
            continue
        sites.add(r.site)
        edges.append((r.module._parameters, r.attr, r.param))
    return edges


class StructureWatch:
    """Applies :func:`find_changes` to a collector's rows: ends sites, rebinds, retires.

    Parameters
    ----------
    model, rows, sites
        The watched model, all rows, and the :class:`~stepscope.collect.activations.ActivationSites`.
    catalog
        Where sites are registered and ended.
    by_stream
        The collector's per-stream row lists (a row whose parameter is gone leaves them).
    sample_size, seed
        The update channel's sampling (a new parameter gets its own indices).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        rows: Sequence[SiteRow],
        sites: Any,
        catalog: Any,
        by_stream: dict[str, list[SiteRow]],
        sample_size: int,
        seed: int,
    ) -> None:
        self.model, self.rows, self.sites, self.catalog = model, rows, sites, catalog
        self.by_stream, self.sample_size, self.seed = by_stream, sample_size, seed
        self._params: list[SiteRow] | None = None
        self._edges: list[tuple[dict[str, Any], str, Any]] | None = None

    def check(self, step: int) -> list[Change]:
        """Find and apply the changes since the last check; sites end at ``step``."""
        if self._params is None:  # one row per parameter site is enough to notice a change
            first = {r.site: r for r in self.rows if r.param is not None}
            self._params = list(first.values())
            self._edges = None
        if self._edges is None:
            self._edges = identity_edges(self.model, self.sites.bound, self._params)
        if all(holder.get(k) is obj for holder, k, obj in self._edges):
            return []  # every object still where it was bound: find_changes would find none
        changes = find_changes(self.model, self.sites.bound, self._params)
        for change in changes:
            self._apply(change, step)
        if changes:
            self._params = None
        self._edges = None
        return changes

    def _apply(self, change: Change, step: int) -> None:
        new = change.replacement
        if change.reason.startswith("module"):
            old = self.sites.bound[change.name]
            self.sites.rebind(change.name, new)
            for r in [r for r in self.rows if r.module is old]:
                self._end(r, step, change.reason)
                r.module = new
                if r.param is not None:
                    self._rebind_param(
                        r, None if new is None else new._parameters.get(r.attr), step
                    )
                elif new is not None:
                    r.module_type, r.signature = type(new).__name__, None  # rediscovered
            return
        for r in self.rows:
            if r.param is not None and r.site == change.name:
                self._end(r, step, change.reason)
                self._rebind_param(r, new, step)

    def _end(self, row: SiteRow, step: int, reason: str) -> None:
        if row.site_id is not None and self.catalog.sites[row.site_id].ended_step is None:
            self.catalog.end_site(row.site_id, step, reason)
        row.site_id = None

    def _rebind_param(self, row: SiteRow, param: Any, step: int) -> None:
        row.param = param
        if param is None:  # gone: the row retires (no new site)
            self.by_stream[row.stream] = [r for r in self.by_stream[row.stream] if r is not row]
            return
        row.numel, row.signature = param.numel(), param_signature(param)
        row.module_type = type(row.module).__name__
        row.site_id = self.catalog.register_site(
            row.site, row.module_type, row.signature, step=step
        )
        if row.stream == "update":
            row.update_index = update_indices(
                row.site, param.numel(), self.sample_size, self.seed, param.device
            )

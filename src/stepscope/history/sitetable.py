"""The growing part of ``catalog.json``: sites, scalar names and disclosure sets.

:class:`SiteTable` is the base of :class:`~stepscope.history.HistoryWriter`, which writes it to
``catalog.json`` before any index row that names a new id (``catalog_dirty``). Changes are made
under a lock, and :meth:`SiteTable.catalog_snapshot` copies the table under the same lock: the
background writer thread writes the catalog while the training thread registers sites.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from stepscope.errors import Refusal
from stepscope.history.inputs import check_step, check_text
from stepscope.history.schema import SiteRecord


class SiteTable:
    """Site records with topology-drift handling, and the interned scalar names and
    disclosure sets that rows refer to by index.

    A site name bound to a *different* structure ends that site (``ended_reason=
    "topology_drift"``) and opens a new one under the name; a site id is never re-bound.

    >>> t = SiteTable()
    >>> a = t.register_site("fc", "torch.nn.Linear", "f32[4,3]", step=0)
    >>> t.register_site("fc", "torch.nn.Linear", "f32[4,3]", step=5) == a
    True
    >>> b = t.register_site("fc", "torch.nn.Linear", "f32[8,3]", step=7)
    >>> (b, t.sites[a].ended_step, t.sites[a].ended_reason)
    (1, 7, 'topology_drift')
    """

    def __init__(self) -> None:
        self.sites: list[SiteRecord] = []
        self.scalar_names: list[str] = []
        self.disclosures: list[tuple[str, ...]] = []
        self._active: dict[str, int] = {}  # site name -> id of its open site
        self._last_step: int | None = None
        self._catalog_dirty = False
        self._table_lock = threading.RLock()  # changes vs. catalog_snapshot on another thread

    def catalog_snapshot(
        self,
    ) -> tuple[list[SiteRecord], list[str], list[tuple[str, ...]]]:
        """Copies of the sites, scalar names and disclosure sets, taken together under the
        table's lock; clears ``catalog_dirty`` (a failed write sets it again: :meth:`_dirty`).

        >>> t = SiteTable()
        >>> _ = t.register_site("fc", "torch.nn.Linear", "f32[4,3]")
        >>> sites, names, disclosures = t.catalog_snapshot()
        >>> ([s.name for s in sites], names, disclosures)
        (['fc'], [], [])
        """
        with self._table_lock:
            self._catalog_dirty = False
            return list(self.sites), list(self.scalar_names), list(self.disclosures)

    def _dirty(self) -> None:
        with self._table_lock:
            self._catalog_dirty = True

    def register_site(
        self,
        name: str,
        module_type: str,
        signature: str,
        label: str | None = None,
        step: int | None = None,
    ) -> int:
        """Return the site id for this structure, starting a new site on topology drift.

        A site whose name is already bound to a *different* structure ends that site
        (``ended_reason="topology_drift"``, at ``step``, else the next step) and opens a new
        one; it never re-binds.
        """
        self._check_open()
        check_text(name, "site name")
        check_text(module_type, "module_type")
        check_text(signature, "signature", limit=10_000)
        if label is not None:
            check_text(label, "label")
        if step is not None:
            check_step(step, "register_site step")
        with self._table_lock:
            current = self._active.get(name)
            if current is not None:
                site = self.sites[current]
                if site.structure == (name, module_type, signature):
                    return current
                self.end_site(
                    current, step if step is not None else self._next_step(), "topology_drift"
                )
            site_id = len(self.sites)
            self.sites.append(SiteRecord(site_id, name, module_type, signature, label, step))
            self._active[name] = site_id
            self._catalog_dirty = True
            return site_id

    def add_site_record(self, site: SiteRecord) -> int:
        """Append a copy of ``site`` as a new site as-is (for merges and copies); returns its id."""
        self._check_open()
        with self._table_lock:
            site_id = len(self.sites)
            self.sites.append(replace(site, site_id=site_id))
            if site.ended_step is None:
                self._active[site.name] = site_id
            self._catalog_dirty = True
            return site_id

    def end_site(self, site_id: int, step: int, reason: str) -> None:
        """Close a site at ``step`` (exclusive) with a reason."""
        with self._table_lock:
            site = self._site(site_id)
            self.sites[site_id] = replace(site, ended_step=int(step), ended_reason=reason)
            if self._active.get(site.name) == site_id:  # an older site never unbinds the name
                del self._active[site.name]
            self._catalog_dirty = True

    def _check_open(self) -> None:
        """A subclass refuses changes once it is closed."""

    def _site(self, site_id: int) -> SiteRecord:
        if not 0 <= site_id < len(self.sites):
            raise Refusal("history_series_unknown", f"site id {site_id} is not registered.")
        return self.sites[site_id]

    def _next_step(self) -> int:
        return 0 if self._last_step is None else self._last_step + 1

    def _intern(self, table: list, value: Any) -> int:
        with self._table_lock:
            try:
                return table.index(value)
            except ValueError:
                table.append(value)
                self._catalog_dirty = True
                return len(table) - 1

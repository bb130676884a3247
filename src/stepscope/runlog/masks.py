"""Gradient cells of branches that did not run: ``not_scheduled``, never a measured zero.

A branch that was skipped for every unit of a step (stochastic depth dropping a block, an expert
that received no token) has no derivative that step. Its parameters' ``.grad`` is ``None`` after
``zero_grad(set_to_none=True)`` (the collector then records ``site_absent``), but persistent
gradient storage (``set_to_none=False``, graph-captured buffers) keeps zeros or stale values that
would read as a measured gradient. :func:`withhold_inactive` rewrites the gradient-stream cells of
every site inside such a branch to presence ``not_scheduled`` with no payload and the disclosure
``branch_not_run:<branch>``. Parameter and update streams are kept: shrinkage (weight decay) can
still move a skipped branch, so its measured update is not necessarily zero.

A site belongs to branch ``b`` when its name is ``b`` or starts with ``b + "."`` (qualified module
names, e.g. branch ``blocks.2`` holds ``blocks.2.fc.weight``).

Example
-------
>>> import numpy as np
>>> from stepscope.history import ObservationBatch, SiteRecord
>>> from stepscope.stats import SPINE_WIDTH
>>> sites = [SiteRecord(0, "blocks.0.fc.weight", "Linear", "f32[2,2]"),
...          SiteRecord(1, "blocks.1.fc.weight", "Linear", "f32[2,2]")]
>>> b = ObservationBatch.observed("gradient", "pre_step", [0, 1], np.zeros((2, SPINE_WIDTH)),
...                               scale_grad="unscaled")
>>> out = withhold_inactive([b], sites, {"blocks.1"})[0]
>>> out.presence.tolist(), bool(np.isnan(out.spines[1]).all())
([1, 2], True)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from stepscope.history import ObservationBatch, Presence, SiteRecord
from stepscope.history.batch import code_of
from stepscope.history.vocab import GRADIENT_STREAMS

NOT_SCHEDULED = code_of(Presence.NOT_SCHEDULED)


def in_branch(site_name: str, branches: Iterable[str]) -> str | None:
    """The branch (of ``branches``) that holds ``site_name``, else ``None``."""
    for b in branches:
        if site_name == b or site_name.startswith(b + "."):
            return b
    return None


def withhold_inactive(
    batches: Sequence[ObservationBatch],
    sites: Sequence[SiteRecord],
    inactive: set[str],
) -> list[ObservationBatch]:
    """``batches`` with gradient cells of ``inactive`` branches marked ``not_scheduled``."""
    if not inactive:
        return list(batches)
    out = []
    for b in batches:
        if b.stream not in GRADIENT_STREAMS or b.n_rows == 0:
            out.append(b)
            continue
        owner = [in_branch(sites[int(i)].name, inactive) for i in b.site_ids]
        hit = np.array([o is not None for o in owner])
        if not hit.any():
            out.append(b)
            continue
        presence = b.presence.copy()
        presence[hit] = NOT_SCHEDULED
        spines = b.spines.copy()
        spines[hit] = np.nan
        hist_rows, hists = b.hist_rows, b.histograms
        if hist_rows is not None and hists is not None:
            keep = ~hit[hist_rows]
            hist_rows, hists = hist_rows[keep], hists[keep]
            if not len(hist_rows):
                hist_rows = hists = None
        base = b.row_disclosures or ((),) * b.n_rows
        rows = tuple(
            (*base[i], f"branch_not_run:{owner[i]}") if owner[i] is not None else base[i]
            for i in range(b.n_rows)
        )
        out.append(
            ObservationBatch(
                b.stream,
                b.phase,
                b.site_ids,
                presence,
                spines,
                hist_rows=hist_rows,
                histograms=hists,
                scale_grad=b.scale_grad,
                micro_batch=b.micro_batch,
                reduction_dtype=b.reduction_dtype,
                disclosures=b.disclosures,
                row_disclosures=rows,
            )
        )
    return out

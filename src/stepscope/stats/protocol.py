"""The ``StreamingStat`` protocol and dataset-mode aggregation over module outputs.

Example
-------
>>> import torch
>>> from stepscope.stats import aggregate
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
>>> batches = [torch.randn(8, 4) for _ in range(3)]
>>> out = aggregate(model, batches, sites="ReLU", stats=("spine", "histogram"))
>>> out["1"]["spine"].total
72
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from stepscope._purity import preserved_state
from stepscope.errors import Refusal
from stepscope.selection import Selector, select_modules
from stepscope.stats.descriptor import HistogramDescriptor
from stepscope.stats.histogram import Histogram
from stepscope.stats.spine import RunningStats


@runtime_checkable
class StreamingStat(Protocol):
    """A statistic that folds tensors in, merges with its own kind, and serialises to JSON."""

    def update(self, tensor: torch.Tensor) -> None: ...

    def merge(self, other: Any) -> Any: ...

    def to_dict(self) -> dict[str, Any]: ...


StatSpec = str | Callable[[], StreamingStat]

#: Built-in statistic names accepted by :func:`aggregate`.
BUILTIN_STATS: dict[str, Callable[[], StreamingStat]] = {
    "spine": RunningStats,
    "histogram": Histogram,
}


def _factories(
    stats: StatSpec | Sequence[StatSpec] | Mapping[str, StatSpec],
) -> dict[str, Callable[[], StreamingStat]]:
    if isinstance(stats, Mapping):
        items = list(stats.items())
    else:
        seq = [stats] if isinstance(stats, str) or callable(stats) else list(stats)
        items = [(s if isinstance(s, str) else getattr(s, "__name__", repr(s)), s) for s in seq]
    out: dict[str, Callable[[], StreamingStat]] = {}
    for name, spec in items:
        if isinstance(spec, str):
            if spec not in BUILTIN_STATS:
                raise Refusal(
                    "stat_unknown",
                    f"unknown statistic {spec!r}",
                    [f"use one of {sorted(BUILTIN_STATS)}"],
                )
            out[name] = BUILTIN_STATS[spec]
        elif callable(spec):
            out[name] = spec
        else:
            raise Refusal("stat_unknown", f"a statistic must be a name or a factory, got {spec!r}")
    if not out:
        raise Refusal(
            "stat_unknown", "no statistic requested", ["pass stats=('spine', 'histogram')"]
        )
    return out


def _output_tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    return []


def aggregate(
    model: torch.nn.Module,
    batches: Iterable[Any],
    sites: Selector = "*",
    stats: StatSpec | Sequence[StatSpec] | Mapping[str, StatSpec] = ("spine",),
    *,
    descriptor: HistogramDescriptor | None = None,
    eval_mode: bool = True,
) -> dict[str, dict[str, StreamingStat]]:
    """Dataset-mode statistics of selected module outputs over an iterable of batches.

    Runs ``model(batch)`` (or ``model(*batch)`` for a tuple/list batch) under ``torch.no_grad``
    with forward hooks on the selected modules, folding each output tensor into fresh statistics.
    A tuple output contributes one site per tensor, named ``"name#i"``.

    Parameters
    ----------
    model
        Any module. Its training flags and every RNG state are restored afterwards; with
        ``eval_mode=True`` (default) it runs in eval mode, so dropout draws no random numbers.
    batches
        Iterable of inputs.
    sites
        A selector (see :mod:`stepscope.selection`): type name, full-name glob, predicate, list.
    stats
        Names (``"spine"``, ``"histogram"``), factories, or a ``{name: spec}`` mapping.
    descriptor
        Histogram grid for the built-in ``"histogram"`` statistic.

    Returns
    -------
    dict
        ``{site_name: {stat_name: stat}}``.

    Raises
    ------
    Refusal
        ``selection_empty`` before running anything when ``sites`` matches no module;
        ``stat_unknown`` for an unknown statistic.
    """
    chosen = select_modules(model, sites)
    factories = _factories(stats)
    if descriptor is not None and factories.get("histogram") is Histogram:
        factories["histogram"] = lambda: Histogram(descriptor)
    results: dict[str, dict[str, StreamingStat]] = {}

    def make_hook(name: str):
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            tensors = _output_tensors(output)
            for i, t in enumerate(tensors):
                key = name if len(tensors) == 1 else f"{name}#{i}"
                slot = results.setdefault(key, {n: f() for n, f in factories.items()})
                for stat in slot.values():
                    stat.update(t.detach())

        return hook

    handles = []
    with preserved_state(model, restore_grads=False):
        try:
            for name, module in chosen:
                handles.append(module.register_forward_hook(make_hook(name)))
            if eval_mode:
                model.eval()
            with torch.no_grad():
                for batch in batches:
                    if isinstance(batch, (tuple, list)):
                        model(*batch)
                    else:
                        model(batch)
        finally:
            for handle in handles:
                handle.remove()
    return results

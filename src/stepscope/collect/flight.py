"""The collector's side of spike forensics: build the flight recorder from its sites.

:func:`open_flight` turns ``WatchSettings(flight_recorder=...)`` into a live
:class:`~stepscope.forensics.flight.Flight` reading the collector's own sites: every parameter
the selection holds (whatever the collector's streams), the selected modules as activation
sites (their ``output_keys``), the collector's update subvectors (same seed and size) and its
training-forward rule. See :mod:`stepscope.forensics.recorder` for what it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from stepscope.collect.settings import WatchSettings
from stepscope.collect.sites import ROOT_SITE, build_rows, update_indices
from stepscope.collect.staging import module_output
from stepscope.forensics.channels import build_channels
from stepscope.forensics.flight import Flight
from stepscope.forensics.reading import SiteReader, local

__all__ = ["open_flight"]


def open_flight(
    settings: WatchSettings,
    modules: Sequence[tuple[str, torch.nn.Module]],
    owners: Sequence[tuple[str, torch.nn.Module]] | None,
    sites: Any,
    path: Path | None,
    rank: int,
    world: int,
    charge: Any = None,
) -> Flight | None:
    """The collector's flight recorder (``None`` without ``settings.flight_recorder``).

    ``modules``/``owners`` are the collector's selection and parameter holders, ``sites`` its
    :class:`~stepscope.collect.activations.ActivationSites` (output keys, training forwards),
    ``path`` its artifact directory, ``charge(seconds)`` its telemetry clock (the recorder's
    hooks are telemetry).
    """
    config = settings.flight_recorder
    if config is None:
        return None
    rows = build_rows(list(modules), ["gradient"], None if owners is None else list(owners))
    params = [
        (r.site, r.param)
        for r in rows
        if r.param is not None and local(r.param).numel() > 0 and config.reads(r.site)
    ]  # an empty parameter has no RMS (never 0/0 = NaN, which would read as non-finite)
    acts = [(name or ROOT_SITE, m) for name, m in modules if config.reads(name or ROOT_SITE)]
    channels = build_channels([n for n, _ in params], [n for n, _ in acts], config.streams)
    size, seed = settings.update_sample_size, settings.update_seed
    keys = sites.keys

    def sample_index(site: str, p: torch.nn.Parameter) -> torch.Tensor | None:
        return update_indices(site, local(p).numel(), size, seed, p.device)

    def select(site: str, output: Any) -> torch.Tensor | None:
        return module_output(output, keys.get(site))[0]

    reader = SiteReader(
        params,
        acts,
        config.streams,
        channels,
        sample_index,
        select,
        sites.training_forward,
        native=settings.kernel_backend != "torch",
        charge=charge,
    )
    flight = Flight(
        config, reader, channels, path, rank, world, settings.event_bus, settings.durable
    )
    reader.attach_modules()
    return flight

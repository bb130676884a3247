"""Row keys of a collector: which (stream, site) pairs it reduces, and the site catalog.

Activation streams have one row per selected module (site = qualified module name);
parameter streams (``gradient``, ``parameter``, ``update``) one row per parameter the selected
modules own directly (site = ``"<module>.<param>"``; a tied parameter belongs to its first owner).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from stepscope.history.sitetable import SiteTable

ACTIVATION_STREAMS = ("activation", "activation_grad")
ROOT_SITE = "<root>"  # display name of the model itself when it is selected
PARAM_STREAMS = ("gradient", "parameter", "update")


@dataclass
class SiteRow:
    """One (stream, site) row of the staging buffer."""

    index: int
    stream: str
    site: str
    module_type: str
    module: torch.nn.Module
    param: torch.nn.Parameter | None = None
    numel: int | None = None  # elements per observation (None until discovered)
    site_id: int | None = None  # catalog id (None until registered)
    signature: str | None = None
    update_index: torch.Tensor | None = field(default=None, repr=False)  # sampled update indices
    attr: str | None = None  # the parameter's attribute name on ``module``


def output_signature(t: torch.Tensor) -> str:
    """Structural signature of a module output: dtype and rank (``float32[*,*,*]``).

    Sizes are not structure: a varying batch or sequence length keeps the site (the size of
    each observation is in its spine's ``total``). A change of dtype or rank starts a new one.
    """
    return f"{str(t.dtype).replace('torch.', '')}[{','.join('*' * t.dim())}]"


#: signatures of activation sites that have not produced a tensor
NOT_RUN = "not_run"
NO_TENSOR = "no_tensor"


def param_signature(p: torch.Tensor) -> str:
    return f"{str(p.dtype).replace('torch.', '')}[{','.join(map(str, p.shape))}]"


def build_rows(
    modules: list[tuple[str, torch.nn.Module]],
    streams: list[str],
    param_owners: list[tuple[str, torch.nn.Module]] | None = None,
) -> list[SiteRow]:
    """All row keys, activation streams first, in module order.

    Parameter rows come from the parameters each of ``param_owners`` (default: ``modules``)
    holds directly; the default selection passes every module that holds one, so a parameter
    of a module with children (``nn.MultiheadAttention.in_proj_weight``, a ViT's ``cls_token``
    on the root model) is observed although only leaves are activation sites.
    """
    rows: list[SiteRow] = []
    seen_params: set[int] = set()
    owned: list[tuple[str, torch.nn.Module, torch.nn.Parameter, str]] = []
    modules = [(name or ROOT_SITE, module) for name, module in modules]
    owners = modules if param_owners is None else [(n or ROOT_SITE, m) for n, m in param_owners]
    for name, module in owners:
        for pname, p in module.named_parameters(recurse=False):
            if id(p) not in seen_params:
                seen_params.add(id(p))
                owned.append((pname if name == ROOT_SITE else f"{name}.{pname}", module, p, pname))
    for stream in streams:
        if stream in ACTIVATION_STREAMS:
            for name, module in modules:
                rows.append(SiteRow(len(rows), stream, name, type(module).__name__, module))
        else:
            for site, module, p, pname in owned:
                rows.append(
                    SiteRow(
                        len(rows),
                        stream,
                        site,
                        type(module).__name__,
                        module,
                        p,
                        p.numel(),
                        attr=pname,
                    )
                )
    return rows


def register_param_sites(rows: list[SiteRow], catalog: Any, step: int) -> None:
    """Register every parameter row's site in ``catalog`` (signature: dtype and shape)."""
    for r in rows:
        if r.param is not None:
            r.signature = param_signature(r.param)
            r.site_id = catalog.register_site(r.site, r.module_type, r.signature, step=step)


def unwrap_compiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside ``torch.compile(model)`` (the model itself when not compiled)."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def leaf_modules(name: str, module: torch.nn.Module) -> bool:
    """The default site selector: modules without children (a bare module is its own leaf)."""
    return next(module.children(), None) is None


def parameter_holders(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every module that holds a parameter directly, in ``named_modules`` order: the default
    selection's parameter sites (leaves and, e.g., ``nn.MultiheadAttention`` or a root model
    holding a position embedding)."""
    return [
        (name, m)
        for name, m in model.named_modules()
        if next(m.parameters(recurse=False), None) is not None
    ]


def update_indices(
    site: str, numel: int, k: int, seed: int, device: torch.device
) -> torch.Tensor | None:
    """``min(numel, k)`` distinct indices from a private generator seeded by (seed, site).

    ``None`` means the whole parameter (exact statistics). The global RNG is never touched.
    """
    if numel <= k:
        return None
    digest = hashlib.sha256(f"{seed}:{site}".encode()).digest()
    gen = torch.Generator(device="cpu").manual_seed(
        int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
    )
    idx = torch.randperm(numel, generator=gen)[:k].sort().values
    return idx.to(device)


class SiteCatalog(SiteTable):
    """Site records with topology-drift handling, for RAM-only runs (the writer is one itself).

    A name bound to a different structure ends its site and starts a new one; never re-binds.
    """

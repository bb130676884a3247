"""A structural model fingerprint: the module tree and parameter shapes/dtypes, hashed.

Values are deliberately excluded: the fingerprint identifies the *architecture* a run was
recorded on, so a resumed run (different weights, same structure) keeps its fingerprint and a
changed architecture does not.

Example
-------
>>> import torch
>>> a = model_fingerprint(torch.nn.Linear(3, 2))
>>> a == model_fingerprint(torch.nn.Linear(3, 2)), a == model_fingerprint(torch.nn.Linear(3, 4))
(True, False)
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only attributes are read: importing history stays free of torch
    import torch


def model_structure(model: torch.nn.Module) -> list[list[str]]:
    """Rows ``[kind, qualified name, type or shape, dtype]`` that the fingerprint hashes."""
    rows: list[list[str]] = []
    for name, module in model.named_modules():
        cls = type(module)
        rows.append(["module", name, f"{cls.__module__}.{cls.__qualname__}", ""])
    for name, p in model.named_parameters():
        rows.append(["parameter", name, "x".join(map(str, p.shape)), str(p.dtype)])
    for name, b in model.named_buffers():
        rows.append(["buffer", name, "x".join(map(str, b.shape)), str(b.dtype)])
    return rows


def model_fingerprint(model: torch.nn.Module) -> str:
    """``sha256:<hex>`` of :func:`model_structure` (module tree, parameter/buffer shapes, dtypes).

    Parameters
    ----------
    model
        Any ``torch.nn.Module``; only its structure is read (no values, no device sync).

    Returns
    -------
    str
        A stable string, equal for structurally identical models.
    """
    text = json.dumps(model_structure(model), separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

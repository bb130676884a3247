"""Directional curvature: the Rayleigh quotient of one curvature matrix along a defined direction.

.. math::

    q_M(v) = \\frac{v^\\top M v}{v^\\top v}, \\qquad M \\in \\{H, G, F\\},

with :math:`H` the Hessian, :math:`G` the generalised Gauss-Newton matrix and :math:`F` the
empirical Fisher of the mean cross-entropy on a fixed probe batch (see
:mod:`stepscope.curvature.products`). :math:`q_H` is **signed** (negative along a direction of
negative curvature, e.g. near a saddle); :math:`q_G, q_F \\ge 0` up to rounding (a value of
order :math:`-\\epsilon \\|M\\|` is reported as computed, never clipped). They are different
quantities and carry different names (:attr:`DirectionalCurvature.quantity`), never one label.

One direction is not a top eigenvalue (see :func:`stepscope.curvature.top_eigenvalues`). A
finite-difference loss-difference estimate is deliberately not offered: with a tiny step it
loses most significant digits to cancellation; the products here are exact up to rounding.

Example
-------
>>> import torch
>>> from stepscope.curvature.quadratic import directional
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
>>> x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
>>> r = directional(model, x, y, direction="random", kind="ggn", seed=0)
>>> r.quantity, r.value >= 0, r.products_used
('ggn_rayleigh_quotient', True, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from stepscope.codec import parse_enum
from stepscope.curvature.base import LOSS_CONVENTION, PSD, CostLedger, CurvatureKind, LossKind
from stepscope.curvature.products import probe_operator
from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal
from stepscope.probe.outputs import OutputSelector


class Direction(str, Enum):
    """Named directions; an explicit direction is a list of tensors, one per trainable parameter."""

    MEAN_GRADIENT = "mean_gradient"
    LAST_UPDATE = "last_update"
    RANDOM = "random"
    GIVEN = "given"


QUANTITY: dict[CurvatureKind, str] = {
    CurvatureKind.HESSIAN: "hessian_rayleigh_quotient_signed",
    CurvatureKind.GGN: "ggn_rayleigh_quotient",
    CurvatureKind.EMPIRICAL_FISHER: "empirical_fisher_rayleigh_quotient",
}


@dataclass(frozen=True)
class DirectionalCurvature(CostLedger):
    """:math:`v^\\top M v / v^\\top v` along one direction, with what it cost.

    Attributes
    ----------
    kind
        ``"hessian"``, ``"ggn"`` or ``"empirical_fisher"``.
    quantity
        The name of the number: ``hessian_rayleigh_quotient_signed``, ``ggn_rayleigh_quotient``
        or ``empirical_fisher_rayleigh_quotient``.
    value
        The quotient (1 / parameter units squared of the loss), or ``None`` when the direction
        has zero norm (the quotient is undefined; never reported as 0).
    signed
        ``True`` for the Hessian (the value may be negative); ``False`` for PSD matrices.
    direction
        What :math:`v` was: ``mean_gradient``, ``last_update``, ``random`` or ``given``.
    direction_norm
        :math:`\\|v\\|_2` before normalisation.
    seed
        Seed of the private generator for ``random``; ``None`` otherwise.
    products_used, gradients_used
        Curvature-vector products and extra gradient (backward) passes spent.
    seconds
        Wall time of the setup and products (outside any training clock).
    """

    kind: str
    quantity: str
    value: float | None
    signed: bool
    direction: str
    direction_norm: float
    seed: int | None
    loss_convention: str = LOSS_CONVENTION
    estimated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (plain floats, ints, strings, ``None``)."""
        return asdict(self)


def directional(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    direction: str | Direction | Sequence[Tensor] = "mean_gradient",
    *,
    kind: str | CurvatureKind = "hessian",
    loss: str | LossKind = "cross_entropy",
    dtype: torch.dtype | None = None,
    update: Sequence[Tensor] | None = None,
    seed: int = DEFAULT_SEED,
    output: OutputSelector = None,
    next_token: bool = False,
) -> DirectionalCurvature:
    """The Rayleigh quotient of the Hessian, GGN or empirical Fisher along a defined direction.

    .. math::

        q_M(v) = \\frac{v^\\top M v}{v^\\top v}

    computed with one exact curvature-vector product (double backward for the Hessian;
    JVP, output Hessian, VJP for the GGN and empirical Fisher).

    Parameters
    ----------
    model
        A classifier returning ``(n, C)`` logits. Evaluated in ``eval()`` mode; its modes,
        parameters, ``.grad``, buffers and RNG states are left as they were.
    x, y
        The fixed probe batch (inputs, integer labels of shape ``(n,)``).
    direction
        ``"mean_gradient"`` (:math:`\\nabla L` on the probe), ``"last_update"`` (needs
        ``update=``), ``"random"`` (Gaussian from a private generator seeded with ``seed``), or a
        list of tensors, one per trainable parameter in ``model.named_parameters()`` order.
    kind
        ``"hessian"`` (signed), ``"ggn"`` or ``"empirical_fisher"`` (non-negative).
    loss
        ``"cross_entropy"``: mean over the batch.
    dtype
        ``None`` (the model's) or ``torch.float64`` (a float64 copy; the model is untouched).
    update
        The last optimizer update, one tensor per trainable parameter (e.g. parameters after
        minus before the step), required for ``direction="last_update"``.
    seed
        Seed for ``direction="random"``; the global RNG is not consumed.
    output, next_token
        Logit selector for dict / ``ModelOutput`` models and the causal-LM shift for ``(n, T)``
        token labels (:mod:`stepscope.probe.outputs`; a sequence's loss sums its tokens).

    Returns
    -------
    DirectionalCurvature

    Raises
    ------
    Refusal
        ``curvature_mode_invalid`` for an unknown kind/loss/direction name;
        ``curvature_input_invalid`` for a missing ``update`` or mis-shaped tensors.
    """
    parsed_kind = parse_enum(CurvatureKind, kind, "curvature kind", "curvature_mode_invalid")
    if isinstance(direction, (str, Direction)):
        how = parse_enum(Direction, direction, "direction", "curvature_mode_invalid")
        if how is Direction.GIVEN:
            raise Refusal(
                "curvature_input_invalid",
                "direction='given' is a label, not a direction.",
                ["pass the direction itself: a list of tensors, one per trainable parameter"],
            )
    else:
        how = Direction.GIVEN
    if how is Direction.LAST_UPDATE and update is None:
        raise Refusal(
            "curvature_input_invalid",
            "direction='last_update' needs the update tensors; stepscope does not guess them.",
            [
                "pass update=[p_after - p_before for each trainable parameter]",
                "or use direction='mean_gradient' / 'random'",
            ],
        )
    with probe_operator(model, x, y, parsed_kind, loss, dtype, output, next_token) as op:
        if how is Direction.MEAN_GRADIENT:
            v = op.flatten(op.mean_gradient())
        elif how is Direction.RANDOM:
            v = op.random_flat(torch.Generator().manual_seed(seed))
        else:
            given = update if how is Direction.LAST_UPDATE else direction
            v = op.flatten(_checked_vector(given, op.shapes))  # type: ignore[arg-type]
            v = v.to(device=op.device, dtype=op.dtype)
        norm_sq = float(v @ v)
        if not math.isfinite(norm_sq):
            raise Refusal(
                "curvature_input_invalid",
                f"the {how.value} direction is not finite (squared norm {norm_sq}).",
                ["check the model, the probe batch and the direction for nan/inf"],
            )
        value: float | None = None
        if norm_sq > 0.0:
            u = v / math.sqrt(norm_sq)  # normalise first: avoids overflow of v^T M v
            value = float(u @ op.matvec_flat(u))
        return DirectionalCurvature(
            kind=parsed_kind.value,
            quantity=QUANTITY[parsed_kind],
            value=value,
            signed=not PSD[parsed_kind],
            direction=how.value,
            direction_norm=math.sqrt(norm_sq),
            seed=seed if how is Direction.RANDOM else None,
            **op.ledger(),
        )


def _checked_vector(tensors: Sequence[Tensor], shapes: Sequence[torch.Size]) -> list[Tensor]:
    if not isinstance(tensors, Sequence) or len(tensors) != len(shapes):
        raise Refusal(
            "curvature_input_invalid",
            f"a direction needs {len(shapes)} tensors (one per trainable parameter).",
            [f"expected shapes {[tuple(s) for s in shapes]}"],
        )
    for t, s in zip(tensors, shapes):
        if not isinstance(t, Tensor) or t.shape != s:
            raise Refusal(
                "curvature_input_invalid",
                "a direction tensor does not match its parameter's shape.",
                [f"expected shapes {[tuple(s) for s in shapes]}"],
            )
    return [t.detach() for t in tensors]

"""Randomised trace estimates of the Hessian, GGN or empirical Fisher, labelled as estimates.

Hutchinson's estimator with Rademacher probes :math:`z_j \\in \\{\\pm 1\\}^P`,

.. math::

    \\widehat{\\operatorname{tr}}(M) = \\frac{1}{m} \\sum_{j=1}^m z_j^\\top M z_j, \\qquad
    \\operatorname{Var}\\big[z^\\top M z\\big] = 2 \\big(\\|M\\|_F^2 - \\textstyle\\sum_i M_{ii}^2\\big),

is unbiased with error :math:`O(1/\\sqrt{m})`; its standard error is the sample standard deviation
of :math:`z_j^\\top M z_j` over :math:`\\sqrt{m}` (``None`` for :math:`m = 1`: undefined, not 0).

Hutch++ (Meyer, Musco, Musco, Woodruff 2021) spends the same budget of :math:`m` products in
thirds: a sketch :math:`Q = \\operatorname{orth}(M S)`, the exact part
:math:`\\operatorname{tr}(Q^\\top M Q)`, and Hutchinson on the deflated remainder
:math:`(I - QQ^\\top) M (I - QQ^\\top)`; it is unbiased, and its error falls like :math:`O(1/m)`
when the spectrum decays. Its standard error is that of the remainder term **given** the sketch.

Example
-------
>>> import torch
>>> from stepscope.curvature.estimators import trace
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
>>> x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
>>> r = trace(model, x, y, kind="ggn", samples=30, seed=0)
>>> r.quantity, r.estimated, r.products_used
('ggn_trace_estimate', True, 30)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from stepscope.codec import parse_enum
from stepscope.curvature.base import (
    LOSS_CONVENTION,
    CostLedger,
    CurvatureKind,
    CurvatureOperator,
    LossKind,
)
from stepscope.curvature.products import probe_operator
from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal
from stepscope.probe.outputs import OutputSelector


class TraceMethod(str, Enum):
    """Randomised trace estimators."""

    HUTCHINSON = "hutchinson"
    HUTCH_PLUS_PLUS = "hutch++"


STANDARD_ERROR_MEANING = {
    TraceMethod.HUTCHINSON: "sample std of z^T M z over sqrt(samples)",
    TraceMethod.HUTCH_PLUS_PLUS: "sample std of the deflated-remainder probes over sqrt(count), "
    "conditional on the sketch",
}


@dataclass(frozen=True)
class TraceEstimate(CostLedger):
    """An unbiased randomised estimate of :math:`\\operatorname{tr}(M)`, never called exact.

    Attributes
    ----------
    estimate
        The trace estimate (1 / parameter units squared of the loss, summed over parameters).
    standard_error
        See ``standard_error_meaning``; ``None`` when fewer than two probes define it.
    samples
        Curvature-vector products spent by the estimator (the budget ``m``).
    """

    kind: str
    quantity: str
    method: str
    estimate: float
    standard_error: float | None
    standard_error_meaning: str
    samples: int
    probe_distribution: str
    seed: int
    loss_convention: str = LOSS_CONVENTION
    estimated: bool = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def trace(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    kind: str | CurvatureKind = "hessian",
    loss: str | LossKind = "cross_entropy",
    method: str | TraceMethod = "hutchinson",
    samples: int = 100,
    seed: int = DEFAULT_SEED,
    dtype: torch.dtype | None = None,
    output: OutputSelector = None,
    next_token: bool = False,
) -> TraceEstimate:
    """Estimate :math:`\\operatorname{tr}(M)` for the Hessian, GGN or empirical Fisher.

    .. math::

        \\widehat{\\operatorname{tr}}(M) = \\frac{1}{m} \\sum_j z_j^\\top M z_j,
        \\quad z_j \\sim \\mathrm{Rademacher}^P

    Parameters
    ----------
    model, x, y
        Classifier returning ``(n, C)`` logits and the fixed probe batch; state is preserved.
    kind
        ``"hessian"``, ``"ggn"`` or ``"empirical_fisher"``.
    loss
        ``"cross_entropy"`` (mean over the batch).
    method
        ``"hutchinson"`` or ``"hutch++"``.
    samples
        Budget of curvature-vector products (``>= 1``; ``>= 3`` for Hutch++).
    seed
        Seed of the private generator (the global RNG is not consumed).
    dtype
        ``None`` (model's) or ``torch.float64`` (float64 copy).
    output, next_token
        Logit selector for dict / ``ModelOutput`` models and the causal-LM shift for ``(n, T)``
        token labels (:mod:`stepscope.probe.outputs`; a sequence's loss sums its tokens).

    Returns
    -------
    TraceEstimate
    """
    parsed_kind = parse_enum(CurvatureKind, kind, "curvature kind", "curvature_mode_invalid")
    parsed_method = parse_enum(TraceMethod, method, "trace method", "curvature_mode_invalid")
    minimum = 3 if parsed_method is TraceMethod.HUTCH_PLUS_PLUS else 1
    if not isinstance(samples, int) or samples < minimum:
        raise Refusal(
            "curvature_input_invalid",
            f"{parsed_method.value} needs samples >= {minimum}; got {samples!r}.",
            [f"pass samples >= {minimum}"],
        )
    with probe_operator(model, x, y, parsed_kind, loss, dtype, output, next_token) as op:
        gen = torch.Generator().manual_seed(seed)
        if parsed_method is TraceMethod.HUTCHINSON:
            estimate, se = _hutchinson(op, samples, gen)
        else:
            estimate, se = _hutch_plus_plus(op, samples, gen)
        return TraceEstimate(
            kind=parsed_kind.value,
            quantity=f"{parsed_kind.value}_trace_estimate",
            method=parsed_method.value,
            estimate=estimate,
            standard_error=se,
            standard_error_meaning=STANDARD_ERROR_MEANING[parsed_method],
            samples=samples,
            probe_distribution="rademacher",
            seed=seed,
            **op.ledger(),
        )


def _quadratic_samples(op: CurvatureOperator, count: int, gen: torch.Generator) -> Tensor:
    out = torch.empty(count, dtype=torch.float64)
    for j in range(count):
        z = op.random_flat(gen, "rademacher")
        out[j] = float(z @ op.matvec_flat(z))
    return out


def _mean_and_se(values: Tensor) -> tuple[float, float | None]:
    mean = float(values.mean())
    if values.numel() < 2:
        return mean, None
    return mean, float(values.std(correction=1)) / math.sqrt(values.numel())


def _hutchinson(
    op: CurvatureOperator, samples: int, gen: torch.Generator
) -> tuple[float, float | None]:
    return _mean_and_se(_quadratic_samples(op, samples, gen))


def _hutch_plus_plus(
    op: CurvatureOperator, samples: int, gen: torch.Generator
) -> tuple[float, float | None]:
    sketch = samples // 3
    remainder = samples - 2 * sketch
    ms = torch.stack(
        [op.matvec_flat(op.random_flat(gen, "rademacher")) for _ in range(sketch)], dim=1
    )
    q, _ = torch.linalg.qr(ms)  # (P, sketch), orthonormal columns
    exact_part = sum(float(q[:, i] @ op.matvec_flat(q[:, i])) for i in range(q.shape[1]))
    rest = torch.empty(remainder, dtype=torch.float64)
    for j in range(remainder):
        z = op.random_flat(gen, "rademacher")
        z = z - q @ (q.T @ z)  # (I - QQ^T) z, so z^T M z samples the deflated remainder
        rest[j] = float(z @ op.matvec_flat(z))
    mean, se = _mean_and_se(rest)
    return exact_part + mean, se

"""Exact curvature-matrix-vector products on a fixed probe batch, counted and timed.

Three symmetric matrices over the trainable parameters :math:`\\theta \\in \\mathbb{R}^P` of a
classifier evaluated on a fixed probe batch :math:`(x_i, y_i)_{i=1}^n`, all for the **mean**
cross-entropy loss

.. math::

    L(\\theta) = \\frac{1}{n} \\sum_{i=1}^n \\ell_i(\\theta), \\qquad
    \\ell_i(\\theta) = -\\log \\operatorname{softmax}(f(x_i; \\theta))_{y_i}.

* ``"hessian"``: :math:`H = \\nabla^2_\\theta L` (symmetric, indefinite in general), applied by
  double backward: :math:`Hv = \\nabla_\\theta \\langle \\nabla_\\theta L, v \\rangle`.
* ``"ggn"``: :math:`G = \\frac{1}{n} \\sum_i J_i^\\top \\Lambda_i J_i` with :math:`J_i` the
  Jacobian of the logits :math:`z_i = f(x_i;\\theta)` and
  :math:`\\Lambda_i = \\operatorname{diag}(p_i) - p_i p_i^\\top` the cross-entropy Hessian in
  logit space (positive semi-definite), applied as Jacobian-vector product (forward mode),
  output Hessian, vector-Jacobian product (reverse mode).
* ``"empirical_fisher"``: :math:`F = \\frac{1}{n} \\sum_i g_i g_i^\\top` with
  :math:`g_i = \\nabla_\\theta \\ell_i` the per-example-loss gradients (positive semi-definite),
  applied as :math:`F v = \\frac{1}{n} J_\\ell^\\top (J_\\ell v)` where :math:`J_\\ell` is the
  Jacobian of the per-example losses, so no per-example gradient is ever materialised.

The model is evaluated in ``eval()`` mode (dropout off, BatchNorm running statistics) so that the
loss is a deterministic function of :math:`\\theta`; parameters are read, never written.

The shared base, :class:`~stepscope.curvature.base.CurvatureOperator` (batch validation,
counting, timing) with the kind and loss vocabularies, is in :mod:`stepscope.curvature.base`.

Example
-------
>>> import torch
>>> from stepscope.curvature.products import make_operator
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Linear(3, 2)
>>> x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
>>> op = make_operator(model, x, y, kind="ggn")
>>> v = torch.randn(op.dim, generator=torch.Generator().manual_seed(0))
>>> bool(v @ op.matvec_flat(v) > 0), op.products_used
(True, 1)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from stepscope._purity import float64_copy, preserved_state
from stepscope.codec import parse_enum
from stepscope.curvature.base import (
    CurvatureKind,
    CurvatureOperator,
    LossKind,
)
from stepscope.errors import Refusal
from stepscope.probe.crossentropy import ce_hessian_product, ce_logit_gradient
from stepscope.probe.outputs import OutputSelector

__all__ = [
    "EmpiricalFisherOperator",
    "GGNOperator",
    "HessianOperator",
    "make_operator",
    "probe_operator",
]


class HessianOperator(CurvatureOperator):
    """:math:`Hv` by double backward through a gradient graph built once."""

    kind = CurvatureKind.HESSIAN

    def _setup(self) -> None:
        leaves = list(self.params.values())
        self._grads = torch.autograd.grad(
            self.mean_loss(), leaves, create_graph=True, allow_unused=True, materialize_grads=True
        )
        # A gradient that does not depend on the parameters (e.g. of an unused parameter) has
        # zero rows and columns in H; it is left out of the second backward.
        self._live = [i for i, g in enumerate(self._grads) if g.requires_grad]
        self.gradients_used += 1

    def mean_gradient(self) -> list[Tensor]:
        return [g.detach() for g in self._grads]  # already computed in setup, no extra pass

    def _apply(self, v: list[Tensor]) -> list[Tensor]:
        leaves = list(self.params.values())
        if not self._live:
            return [torch.zeros_like(t) for t in v]
        hv = torch.autograd.grad(
            [self._grads[i] for i in self._live],
            leaves,
            grad_outputs=[v[i] for i in self._live],
            retain_graph=True,
            allow_unused=True,
            materialize_grads=True,
        )
        return list(hv)


class _OutputCurvatureOperator(CurvatureOperator):
    """:math:`J^\\top \\Lambda J v`: forward-mode JVP, a per-output weighting, cached reverse VJP."""

    def _outputs(self, params: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def _weight(self, jv: Tensor) -> Tensor:
        raise NotImplementedError

    def _setup(self) -> None:
        # Plain autograd (no torch.func transform), so custom autograd.Functions work in reverse.
        self._out = self._outputs(self.params)

    def _vjp(self, cotangent: Tensor) -> list[Tensor]:
        grads = torch.autograd.grad(
            self._out,
            list(self.params.values()),
            grad_outputs=cotangent,
            retain_graph=True,
            allow_unused=True,
            materialize_grads=True,
        )
        return list(grads)

    def _apply(self, v: list[Tensor]) -> list[Tensor]:
        # Forward-mode AD directly (dual tensors): ~3x less overhead than torch.func.jvp here.
        try:
            with fwAD.dual_level():
                duals = {
                    name: fwAD.make_dual(self.params[name].detach(), t)
                    for name, t in zip(self.names, v)
                }
                jv = fwAD.unpack_dual(self._outputs(duals)).tangent
        except (NotImplementedError, RuntimeError) as exc:
            raise Refusal(
                "curvature_model_unsupported",
                f"forward-mode AD (the Jacobian-vector product of the {self.kind.value}) "
                f"failed on this model: {exc}",
                ["use kind='hessian' (reverse mode only)", "replace the unsupported layer"],
            ) from exc
        if jv is None:  # reverse mode sees the parameters but forward mode does not
            raise Refusal(
                "curvature_model_unsupported",
                "forward-mode AD found no dependence of the outputs on the parameters.",
                ["use kind='hessian'", "avoid .detach()/.data inside forward"],
            )
        return self._vjp(self._weight(jv))


class GGNOperator(_OutputCurvatureOperator):
    """:math:`Gv = \\frac{1}{n} \\sum_i J_i^\\top (\\operatorname{diag}(p_i) - p_i p_i^\\top) J_i v`."""

    kind = CurvatureKind.GGN

    def _outputs(self, params: dict[str, Tensor]) -> Tensor:
        return self.logits(params)

    def _setup(self) -> None:
        super()._setup()
        self._probs = torch.softmax(self._out.detach(), dim=1)  # fixed at theta

    def _weight(self, jv: Tensor) -> Tensor:
        # (diag(p) - p p^T) u without the u - <p, u> cancellation at high confidence
        return ce_hessian_product(self._probs, jv) / self.x.shape[0]


class EmpiricalFisherOperator(_OutputCurvatureOperator):
    """:math:`Fv = \\frac{1}{n} \\sum_i g_i (g_i^\\top v)` through the logits' Jacobian.

    ``g_i = J_i^T r_i`` with ``r_i`` the cancellation-free CE logit gradient
    (:func:`~stepscope.probe.crossentropy.ce_logit_gradient`, summed over a sequence's scored
    rows), so a confident prediction keeps its tiny but non-zero gradient.
    """

    kind = CurvatureKind.EMPIRICAL_FISHER

    def _outputs(self, params: dict[str, Tensor]) -> Tensor:
        return self.logits(params)

    def _setup(self) -> None:
        super()._setup()
        assert self._scored is not None  # set by the first logits() call
        self._rows = ce_logit_gradient(self._out, self._scored.labels)

    def _weight(self, jv: Tensor) -> Tensor:
        per_row = (self._rows * jv).sum(dim=1)  # <r, J v> per scored row
        scored = self._scored
        assert scored is not None
        if scored.keep is not None:  # a sequence's loss sums its rows
            per_example = per_row.new_zeros(self.x.shape[0]).index_add(0, scored.owner, per_row)
            per_row = per_example[scored.owner]
        return self._rows * per_row.unsqueeze(1) / self.x.shape[0]


_OPERATORS: dict[CurvatureKind, type[CurvatureOperator]] = {
    CurvatureKind.HESSIAN: HessianOperator,
    CurvatureKind.GGN: GGNOperator,
    CurvatureKind.EMPIRICAL_FISHER: EmpiricalFisherOperator,
}


def make_operator(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    kind: CurvatureKind | str = "hessian",
    loss: LossKind | str = "cross_entropy",
    output: OutputSelector = None,
    next_token: bool = False,
) -> CurvatureOperator:
    """The operator for ``kind`` on ``model`` as it is (no state guard; see :func:`probe_operator`)."""
    operator = _OPERATORS[
        parse_enum(CurvatureKind, kind, "curvature kind", "curvature_mode_invalid")
    ]
    return operator(model, x, y, loss, output=output, next_token=next_token)


@contextmanager
def probe_operator(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    kind: CurvatureKind | str = "hessian",
    loss: LossKind | str = "cross_entropy",
    dtype: torch.dtype | None = None,
    output: OutputSelector = None,
    next_token: bool = False,
) -> Iterator[CurvatureOperator]:
    """An operator in ``eval()`` mode inside :func:`~stepscope._purity.preserved_state`.

    Modes, ``.grad``, ``requires_grad`` and every RNG state are restored on exit; parameters and
    buffers are only read. ``dtype=torch.float64`` measures a float64 copy of the model (the
    original is untouched) with floating inputs cast to float64.
    """
    parse_enum(CurvatureKind, kind, "curvature kind", "curvature_mode_invalid")
    parse_enum(LossKind, loss, "loss", "curvature_mode_invalid")
    with preserved_state(model):
        target = _model_in_dtype(model, dtype)
        target.eval()
        yield make_operator(target, x, y, kind, loss, output, next_token)


def _model_in_dtype(model: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
    current = next((p.dtype for p in model.parameters()), None)
    if dtype is None or dtype == current:
        return model
    if dtype == torch.float64:
        return float64_copy(model)
    raise Refusal(
        "curvature_input_invalid",
        f"dtype={dtype} is not supported (model parameters are {current}).",
        ["pass dtype=None to use the model as it is, or dtype=torch.float64"],
    )

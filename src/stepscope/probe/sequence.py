"""Per-example gradients of the layers transformers are made of, sequences and shared weights included.

One example is one sequence: its gradient sums over positions (and over every call of a module,
and over every module that uses the same parameter). Each call of a module contributes a
:data:`Use` to each of its parameters, in one of two forms:

- **Kronecker sum** (:class:`KroneckerUse`) ``g_i = sum_p l_ip r_ip^T`` in the parameter's own
  ``(rows, cols)`` layout: ``nn.Linear`` (``l`` = output backprop, ``r`` = input), HF ``Conv1D``
  (transposed Linear, ``weight (d_in, d_out)``: ``l`` = input, ``r`` = backprop),
  ``nn.Conv1d``/``nn.Conv2d`` (``r`` = unfolded receptive field) and ``nn.Embedding`` (``l`` =
  the one-hot token, kept as an index, ``r`` = backprop; ``padding_idx`` positions contribute
  nothing).
- **Dense** (:class:`DenseUse`): the per-example gradient itself, ``(n, numel)``: biases
  (``sum_p b_ip``) and LayerNorm / RMSNorm weights (``sum_p b_ip * xhat_ip``).

Squared norms of the total per-example gradient use ``||sum_u g^u||^2 = sum_{u,v} <g^u, g^v>``
with the Gram ("ghost norm") identity for Kronecker sums,

.. math:: \\langle \\textstyle\\sum_p l_p r_p^\\top, \\sum_q l'_q r'^\\top_q \\rangle
    = \\sum_{p,q} (l_p \\cdot l'_q)(r_p \\cdot r'_q),

where a one-hot ``l`` makes ``l_p . l'_q`` a gather (``l'_q[token_p]``) or an equality test; a
single Kronecker use materialises ``B_i A_i^T`` instead when that costs fewer flops
(:func:`stepscope.probe.moments.per_example_sq_norms`).

Example
-------
>>> import torch
>>> emb = torch.nn.Embedding(5, 3)
>>> uses = [module_use(emb, "weight", torch.tensor([[1, 1, 2]]), torch.ones(1, 3, 3))]
>>> sq, total = parameter_sq_norms_and_sum(uses, emb.weight.shape)
>>> float(sq[0]), total.reshape(5, 3)[1].tolist()  # token 1 twice: (2, 2, 2); token 2: (1, 1, 1)
(15.0, [2.0, 2.0, 2.0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from stepscope.errors import Refusal
from stepscope.probe.moments import OUTER_CHUNK_ELEMENTS, choose_method, per_example_sq_norms

#: kind label per supported module type (the record's ``kind``)
KINDS: dict[type, str] = {
    nn.Linear: "linear",
    nn.Conv1d: "conv1d",
    nn.Conv2d: "conv2d",
    nn.Embedding: "embedding",
    nn.LayerNorm: "layernorm",
    nn.RMSNorm: "rmsnorm",
}


def is_hf_conv1d(module: nn.Module) -> bool:
    """HF ``transformers.pytorch_utils.Conv1D`` (a Linear with ``weight (d_in, d_out)``)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def is_elementwise_affine(module: nn.Module) -> bool:
    """An RMSNorm-/LayerNorm-like module by its parameters (HF ``LlamaRMSNorm``, ``T5LayerNorm``).

    The rule: its own parameters are a 1-D ``weight`` and optionally a ``bias`` of the same shape,
    and no child holds a parameter. Whether the output really is ``weight * xhat + bias`` (with
    ``xhat`` the output at ``weight = 1, bias = 0``) is checked on every call
    (:func:`elementwise_affine_mismatch`); a module that fails is absent with its reason.
    """
    own = dict(module.named_parameters(recurse=False))
    weight, bias = own.get("weight"), own.get("bias")
    return (
        weight is not None
        and set(own) <= {"weight", "bias"}
        and weight.dim() == 1
        and (bias is None or bias.shape == weight.shape)
        and not any(True for child in module.children() for _ in child.parameters())
    )


def module_kind(module: nn.Module) -> str | None:
    """The probe's kind label for ``module``, or ``None`` when it has no per-example rule."""
    if is_hf_conv1d(module):
        return "hf_conv1d"
    kind = KINDS.get(type(module)) or next(
        (k for t, k in KINDS.items() if isinstance(module, t)), None
    )
    if kind is None and is_elementwise_affine(module):
        return "elementwise_affine"
    return kind


def _affine_parameters(module: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(weight, bias or None)`` of a LayerNorm-like module."""
    own = dict(module.named_parameters(recurse=False))
    return own["weight"], own.get("bias")


def _unit_affine(module: nn.Module, inp: Tensor, weight_value: float = 1.0) -> Tensor:
    """The module's output with ``weight = weight_value`` everywhere and ``bias = 0``."""
    w, bias = _affine_parameters(module)
    values = {"weight": torch.full_like(w, weight_value)}
    if bias is not None:
        values["bias"] = torch.zeros_like(bias)
    return torch.func.functional_call(module, values, (inp,))


def elementwise_affine_mismatch(module: nn.Module, inp: Tensor, out: Tensor) -> str | None:
    """``None`` when the call's output is ``weight * xhat + bias`` with ``xhat`` independent of
    the weight (checked at the weight, at 1 and at 2, to rounding); else why not."""
    w, b = _affine_parameters(module)
    if out.shape[-1:] != w.shape:
        return "weight_not_on_the_last_axis"
    with torch.no_grad():
        xhat = _unit_affine(module, inp)
        bias: Tensor | float = b if b is not None else 0.0
        eps = torch.finfo(out.dtype).eps * 16
        scale = float(out.abs().max()) if out.numel() else 0.0
        if not torch.allclose(out, w * xhat + bias, rtol=eps, atol=eps * scale):
            return "output_not_weight_times_normalised_input"
        if not torch.allclose(_unit_affine(module, inp, 2.0), 2 * xhat, rtol=eps, atol=eps * scale):
            return "output_not_linear_in_weight"
    return None


def measured_parameters(module: nn.Module) -> list[str]:
    """``weight``/``bias`` names of ``module`` that are parameters (norms may have none)."""
    return [
        part for part in ("weight", "bias") if isinstance(getattr(module, part, None), nn.Parameter)
    ]


def check_module(name: str, module: nn.Module) -> None:
    """Refuse ``probe_layer_unsupported`` for modules or options without a per-example rule."""
    problem = module_problem(module)
    if problem:
        raise Refusal(
            "probe_layer_unsupported",
            f"layer {name!r}: {problem}",
            ["exclude this layer via layers=[...]"],
        )


def module_problem(module: nn.Module) -> str | None:
    """Why ``module`` has no per-example rule here (``None``: it has one)."""
    kind = module_kind(module)
    if kind is None:
        return (
            f"{type(module).__name__} has no per-example gradient rule here; the probe measures "
            "Linear, HF Conv1D, Conv1d/Conv2d (groups 1), Embedding, LayerNorm, RMSNorm and "
            "LayerNorm-like modules (a 1-D weight, an optional bias, no child parameters)"
        )
    if kind in ("conv1d", "conv2d") and module.groups != 1:
        return f"{type(module).__name__} with groups={module.groups} is not measured"
    if kind == "embedding" and (module.max_norm is not None or module.scale_grad_by_freq):
        return (
            "Embedding with max_norm (renormalises the weight in place) or "
            "scale_grad_by_freq (batch-dependent gradient) is not measured"
        )
    if not measured_parameters(module):
        return f"{type(module).__name__} has no weight or bias parameter"
    return None


def uncovered_parameters(
    model: nn.Module, layers: dict[str, nn.Module]
) -> dict[str, dict[str, str]]:
    """Every parameter of ``model`` the probe does not measure, with its module type and reason.

    Reasons: ``not_selected`` (its module has a rule but is outside ``layers=``),
    ``not_weight_or_bias`` (a parameter such as ViT's ``cls_token`` beside the module's rule),
    ``no_per_example_rule`` (``detail`` says why). A parameter tied to a measured one is covered.
    """
    covered = {id(getattr(m, part)) for m in layers.values() for part in measured_parameters(m)}
    out: dict[str, dict[str, str]] = {}
    for name, module in model.named_modules():
        for attr, p in module.named_parameters(recurse=False):
            if id(p) in covered:
                continue
            covered.add(id(p))  # a tied alias is listed once, under its first owner
            problem = module_problem(module)
            if problem is not None:
                reason, detail = "no_per_example_rule", problem
            elif attr not in ("weight", "bias"):
                reason, detail = "not_weight_or_bias", f"parameter {attr!r} has no rule"
            else:
                reason, detail = "not_selected", "outside layers=[...]"
            key = f"{name}.{attr}" if name else attr
            out[key] = {"module_type": type(module).__name__, "reason": reason, "detail": detail}
    return out


@dataclass(frozen=True)
class KroneckerUse:
    """One call's per-example gradients of one parameter as ``g_i = sum_p l_ip r_ip^T``.

    ``left`` ``(n, P, rows)`` (or ``(n, P)`` int64 row indices for Embedding) and ``right``
    ``(n, P, cols)``.
    """

    left: Tensor
    right: Tensor

    @property
    def indexed(self) -> bool:
        """Whether ``left`` holds one-hot row indices (Embedding)."""
        return not self.left.is_floating_point()


@dataclass(frozen=True)
class DenseUse:
    """One call's per-example gradients of one parameter, materialised: ``(n, numel)``."""

    per_example: Tensor


#: one call's contribution to one parameter's per-example gradients
Use: TypeAlias = KroneckerUse | DenseUse


def _positions(t: Tensor, n: int) -> Tensor:
    """``(n, ..., d)`` -> ``(n, P, d)``."""
    return t.reshape(n, -1, t.shape[-1])


def _unfold(module: nn.Conv1d | nn.Conv2d, x: Tensor) -> Tensor:
    """Receptive fields ``(n, L, C_in * prod(kernel))`` ordered like ``weight.reshape(o, -1)``."""
    padding: Any = module.padding
    if isinstance(padding, str) or module.padding_mode != "zeros":
        # the same explicit padding the convolution applies itself for 'same' and non-zero modes
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=mode)
        padding = (0,) * len(module.kernel_size)
    kernel, dilation, stride = module.kernel_size, module.dilation, module.stride
    if isinstance(module, nn.Conv1d):  # a Conv1d is a Conv2d of height 1
        x = x.unsqueeze(2)
        kernel, dilation, stride = (1, *kernel), (1, *dilation), (1, *stride)
        padding = (0, *padding)
    return F.unfold(x, kernel, dilation, padding, stride).transpose(1, 2)


def _normalized(module: nn.LayerNorm | nn.RMSNorm, x: Tensor) -> Tensor:
    """``xhat`` as the module computes it before its elementwise affine (the same fused kernel)."""
    shape = tuple(module.normalized_shape)
    if isinstance(module, nn.LayerNorm):
        return F.layer_norm(x, shape, None, None, module.eps)
    return F.rms_norm(x, shape, None, module.eps)


def module_use(module: nn.Module, part: str, inp: Tensor, grad: Tensor) -> Use:
    """The :data:`Use` of one call of ``module`` for its parameter ``part`` (``weight``/``bias``).

    Parameters
    ----------
    inp
        The call's input; ``grad`` the per-example-scale derivative of the loss at its output.
    """
    n = grad.shape[0]
    hf_conv1d = is_hf_conv1d(module)  # decided first, as in module_kind
    if not hf_conv1d and module_kind(module) == "elementwise_affine":
        d = int(_affine_parameters(module)[0].shape[0])
        b = grad.reshape(n, -1, d)
        if part == "bias":
            return DenseUse(b.sum(1))
        with torch.no_grad():
            xhat = _unit_affine(module, inp).reshape(n, -1, d)
        return DenseUse((b * xhat).sum(1))
    if not hf_conv1d and isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        shape = module.normalized_shape
        b = grad.reshape(n, -1, *shape)
        if part == "bias":
            return DenseUse(b.sum(1).reshape(n, -1))
        xhat = _normalized(module, inp).reshape(n, -1, *shape)
        return DenseUse((b * xhat).sum(1).reshape(n, -1))
    if not hf_conv1d and isinstance(module, (nn.Conv1d, nn.Conv2d)):
        b = grad.reshape(n, grad.shape[1], -1).transpose(1, 2)  # (n, L, o)
        if part == "bias":
            return DenseUse(b.sum(1))
        return KroneckerUse(left=b, right=_unfold(module, inp))
    if not hf_conv1d and isinstance(module, nn.Embedding):
        idx = inp.reshape(n, -1)
        b = _positions(grad, n)
        if module.padding_idx is not None:  # the padding row never receives a gradient
            b = b * (idx != module.padding_idx).unsqueeze(-1).to(b.dtype)
        return KroneckerUse(left=idx.long(), right=b)
    b = _positions(grad, n)
    if part == "bias":
        return DenseUse(b.sum(1))
    a = _positions(inp, n)
    return KroneckerUse(left=a, right=b) if hf_conv1d else KroneckerUse(left=b, right=a)


def _left_gram(u: KroneckerUse, v: KroneckerUse) -> Tensor:
    """``(n, P_u, P_v)`` inner products of the left factors."""
    if u.indexed and v.indexed:
        return (u.left.unsqueeze(2) == v.left.unsqueeze(1)).to(u.right.dtype)
    if u.indexed:
        return _left_gram(v, u).transpose(1, 2)
    if v.indexed:  # l_p . e_{token_q} = l_p[token_q]
        index = v.left.unsqueeze(1).expand(-1, u.left.shape[1], -1)
        return u.left.gather(2, index)
    return torch.bmm(u.left, v.left.transpose(1, 2))


def _materialise(u: Use, rows: int) -> Tensor:
    """``(n, rows * cols)`` per-example gradients of a use (fallback for mixed forms)."""
    if isinstance(u, DenseUse):
        return u.per_example
    n, _, cols = u.right.shape
    if u.indexed:
        out = u.right.new_zeros(n, rows, cols)
        out.scatter_add_(1, u.left.unsqueeze(-1).expand(-1, -1, cols), u.right)
        return out.reshape(n, -1)
    return torch.bmm(u.left.transpose(1, 2), u.right).reshape(n, -1)


def _cross(u: Use, v: Use, rows: int) -> Tensor:
    """``<g^u_i, g^v_i>`` for every example, ``(n,)``."""
    if isinstance(u, KroneckerUse) and isinstance(v, KroneckerUse):
        kr = torch.bmm(u.right, v.right.transpose(1, 2))
        return (_left_gram(u, v) * kr).sum((1, 2))
    return (_materialise(u, rows) * _materialise(v, rows)).sum(1)


def _self(u: Use, rows: int) -> Tensor:
    if isinstance(u, DenseUse):
        return u.per_example.square().sum(1)
    if u.indexed:
        return _cross(u, u, rows)
    if u.left.shape[1] == 1:  # one position: ||l||^2 ||r||^2
        return per_example_sq_norms(u.right[:, 0], u.left[:, 0])
    return per_example_sq_norms(u.right.transpose(1, 2), u.left.transpose(1, 2))


def _sum(u: Use, rows: int) -> Tensor:
    if isinstance(u, DenseUse):
        return u.per_example.sum(0)
    cols = u.right.shape[-1]
    right = u.right.reshape(-1, cols)
    if u.indexed:
        return right.new_zeros(rows, cols).index_add_(0, u.left.reshape(-1), right).reshape(-1)
    return (u.left.reshape(-1, u.left.shape[-1]).T @ right).reshape(-1)


def parameter_sq_norms_and_sum(uses: list[Use], shape: torch.Size) -> tuple[Tensor, Tensor]:
    """``(||g_i||^2 for each example, sum_i g_i flattened)`` of a parameter over all its uses."""
    rows = shape[0]
    u = uses[0]
    if len(uses) == 1 and isinstance(u, KroneckerUse) and not u.indexed and u.left.shape[1] > 1:
        n, positions, o = u.left.shape
        d = u.right.shape[-1]
        if choose_method(n, d, o, positions) == "outer" and n * o * d <= OUTER_CHUNK_ELEMENTS:
            # the per-example gradients are materialised anyway: their sum is the mean gradient
            g = torch.bmm(u.left.transpose(1, 2), u.right)
            return torch.linalg.vector_norm(g, dim=(1, 2)).square(), g.sum(0).reshape(-1)
    sq = _self(u, rows)
    total = _sum(u, rows)
    for j, u in enumerate(uses[1:], start=1):
        sq = sq + _self(u, rows)
        for v in uses[:j]:
            sq = sq + 2 * _cross(u, v, rows)
        total = total + _sum(u, rows)
    return sq, total


__all__ = [
    "KINDS",
    "DenseUse",
    "KroneckerUse",
    "Use",
    "check_module",
    "elementwise_affine_mismatch",
    "is_elementwise_affine",
    "is_hf_conv1d",
    "measured_parameters",
    "module_kind",
    "module_problem",
    "module_use",
    "parameter_sq_norms_and_sum",
    "uncovered_parameters",
]

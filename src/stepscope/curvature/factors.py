"""Per-layer activation and backprop factors, and their spectra without forming big matrices.

For an affine layer with inputs :math:`a_{ip} \\in \\mathbb{R}^{D}` at positions ``p`` (one
position for ``nn.Linear`` on ``(n, D)``; every sequence position of a ``nn.Linear`` / HF
``Conv1D`` on ``(n, T, D)``; the unfolded receptive fields at each output position of an
``nn.Conv2d``) and outputs :math:`z_{ip} = W a_{ip} + b`, a family's backprop rows are
:math:`B_{ikp} = J_{z_{ip}}^\\top v_{ik}` (the derivative of :math:`v_{ik}^\\top f_i` with
respect to :math:`z_{ip}`). The normalised KFAC factors come in the two conventions of
Eschenhagen et al. (NeurIPS 2023), the same as curvlinops' ``kfac_approx``:

.. math::

    \\text{expand:}\\quad \\bar A = \\frac{1}{nP} \\sum_{i,p} a_{ip} a_{ip}^\\top, \\quad
    \\bar B = \\frac{1}{n} \\sum_{i,k,p} B_{ikp} B_{ikp}^\\top;
    \\qquad
    \\text{reduce:}\\quad \\bar A = \\frac1n \\sum_i \\hat a_i \\hat a_i^\\top,\\
    \\hat a_i = \\frac1P \\sum_p a_{ip}, \\quad
    \\bar B = \\frac1n \\sum_{i,k} \\hat B_{ik} \\hat B_{ik}^\\top,\\ \\hat B_{ik} = \\sum_p B_{ikp},

(identical when ``P = 1``), and KFAC is :math:`\\bar B \\otimes \\bar A` in row-major
``vec(W[out, in])`` order (HF ``Conv1D`` stores ``W^T``; its block is the same matrix).

Spectra are computed from the smaller of the two Gram forms (``X^T X / n`` is ``d x d`` and
``X X^T / n`` is ``rows x rows``; their non-zero eigenvalues coincide), so the eigenproblem
dimension is ``min(d, rows)``; the remaining ``d - rows`` eigenvalues are exactly zero and are
counted, not listed. Above ``eig_max_dimension`` a labelled block subspace iteration returns the
top ``k`` eigenvalues only.

Example
-------
>>> import torch
>>> from stepscope.curvature.factors import factor_spectrum
>>> x = torch.eye(3, dtype=torch.float64)
>>> factor_spectrum(x, n=1, eig_max_dimension=10)["top_eigenvalue"]
1.0
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import Tensor, nn

from stepscope.errors import Refusal
from stepscope.probe.sequence import is_hf_conv1d

#: convolutions other than Conv2d (whose KFAC-expand factors are implemented) refuse
_UNSUPPORTED_AFFINE = (
    nn.Conv1d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
)
#: ``nn.Linear``, HF ``Conv1D`` (duck-typed) or ``nn.Conv2d``
AffineLayer = nn.Module
APPROX_TOP_K = 32
APPROX_METHOD = "block_subspace_iteration_top_k"
EXACT_METHOD = "dense_symmetric_eigensolver"


class KfacApprox(str, Enum):
    """How KFAC treats the positions (weight-sharing dimension) of one example."""

    EXPAND = "expand"  #: positions are extra examples (Abar averages a a^T over them)
    REDUCE = "reduce"  #: positions are averaged (inputs) / summed (backprops) first


@dataclass
class LayerCapture:
    """What one forward pass recorded for an affine layer (float64, autograd-connected)."""

    name: str
    module: AffineLayer
    inputs: Tensor  #: ``(n, P, D)`` layer inputs ``a_ip`` (P positions; 1 for Linear on (n, D))
    outputs: Tensor  #: layer output (graph node to differentiate at)


def _conv_padding(name: str, module: nn.Conv2d) -> tuple[int, ...]:
    """The numeric zero padding of a supported Conv2d; refuses every other configuration."""
    padding = module.padding
    if module.groups != 1 or module.padding_mode != "zeros" or isinstance(padding, str):
        raise Refusal(
            "curvature_model_unsupported",
            f"Conv2d {name!r} uses groups={module.groups}, padding={module.padding!r}, "
            f"padding_mode={module.padding_mode!r}; only groups=1 with numeric zero padding is "
            "supported",
            ["use groups=1 and an integer/tuple padding"],
        )
    return padding


def out_features(module: AffineLayer) -> int:
    """Output width ``d_out`` (HF ``Conv1D`` stores ``weight (d_in, d_out)``)."""
    if isinstance(module, (nn.Linear, nn.Conv2d)):
        return int(module.weight.shape[0])
    return int(module.get_parameter("weight").shape[1])  # HF Conv1D (its ``nf``)


def affine_layers(
    model: nn.Module,
    names: Sequence[str] | None = None,
    unsupported: dict[str, dict[str, str]] | None = None,
) -> list[tuple[str, AffineLayer]]:
    """The model's ``nn.Linear``, HF ``Conv1D`` and ``nn.Conv2d`` layers by qualified name.

    ``names`` restricts the analysis to those layers (each must be one of the three types).
    Without ``names``, a layer whose parameter another module also holds (a tied LM head) is left
    out and recorded in ``unsupported`` (``name -> {"reason", "detail"}``); the rest is analysed.

    Raises
    ------
    Refusal
        ``curvature_model_unsupported`` for other convolutions or no layer;
        ``curvature_weight_shared`` when a layer named in ``names`` shares a parameter with
        another module (a tied embedding / LM head), naming both.
    """
    layers: list[tuple[str, AffineLayer]] = []
    wanted = None if names is None else set(names)
    for name, module in model.named_modules():
        if wanted is not None and name not in wanted:
            continue
        if isinstance(module, _UNSUPPORTED_AFFINE):
            raise Refusal(
                "curvature_model_unsupported",
                f"layer {name!r} is a {type(module).__name__}; only Linear, HF Conv1D and Conv2d "
                "layers have per-example factors here",
                ["analyse the Linear/Conv1D/Conv2d part of the model (layers=[...])"],
            )
        if isinstance(module, nn.Conv2d):
            _conv_padding(name, module)  # refuses what _patches cannot unfold, before any forward
            layers.append((name, module))
        elif isinstance(module, nn.Linear) or is_hf_conv1d(module):
            layers.append((name, module))
        elif wanted is not None:
            raise Refusal(
                "curvature_model_unsupported",
                f"layer {name!r} is a {type(module).__name__}, not Linear, HF Conv1D or Conv2d",
                ["name Linear, Conv1D or Conv2d modules in layers=[...]"],
            )
    if wanted is None:
        shared = _shared_with(model, layers)
        for owner, other in shared.items():
            if unsupported is not None:
                unsupported[owner] = {
                    "reason": "curvature_weight_shared",
                    "detail": f"shares a parameter with module {other!r} (tied weights); its "
                    "block would miss the other use",
                }
        layers = [(n, m) for n, m in layers if n not in shared]
    missing = sorted((wanted or set()) - {n for n, _ in layers})
    if missing or not layers:
        raise Refusal(
            "curvature_model_unsupported",
            f"no such layers {missing}"
            if missing
            else "the model has no nn.Linear, HF Conv1D or nn.Conv2d layer to analyse",
            ["pass a model with at least one nn.Linear layer", "check the names in layers=[...]"],
        )
    _refuse_shared(model, layers)
    return layers


def _shared_with(model: nn.Module, layers: Sequence[tuple[str, AffineLayer]]) -> dict[str, str]:
    """Layer -> the first other module holding one of its parameters."""
    mine = {id(p): name for name, m in layers for p in m.parameters(recurse=False)}
    found: dict[str, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for p in module.parameters(recurse=False):
            owner = mine.get(id(p))
            if owner is not None and module is not dict(layers)[owner]:
                found.setdefault(owner, name)
    return found


def _refuse_shared(model: nn.Module, layers: Sequence[tuple[str, AffineLayer]]) -> None:
    for owner, name in _shared_with(model, layers).items():
        raise Refusal(
            "curvature_weight_shared",
            f"layer {owner!r} shares a parameter with module {name!r} (tied weights); "
            "its curvature block would miss the other use",
            [
                "untie the weights (e.g. tie_word_embeddings=False)",
                f"or leave {owner!r} out via layers=[...]",
            ],
        )


def _patches(name: str, module: AffineLayer, a: Tensor, n: int) -> Tensor:
    """Layer input as ``(n, P, D)``: positions for Linear/Conv1D, receptive fields for Conv2d."""
    if isinstance(module, nn.Conv2d):
        if a.ndim != 4 or a.shape[0] != n:
            raise Refusal(
                "curvature_model_unsupported",
                f"Conv2d {name!r} received input of shape {tuple(a.shape)}; expected (n, C, H, W)",
                ["pass batched 4-D inputs"],
            )
        padding = _conv_padding(name, module)
        cols = torch.nn.functional.unfold(
            a, module.kernel_size, module.dilation, padding, module.stride
        )  # (n, C_in * kh * kw, P), ordered like weight.reshape(C_out, -1)
        return cols.transpose(1, 2)
    if a.ndim < 2 or a.shape[0] != n:
        raise Refusal(
            "curvature_model_unsupported",
            f"layer {name!r} received input of shape {tuple(a.shape)}; expected (n, ..., d_in) "
            f"with the batch of {n} first",
            ["keep the batch dimension first"],
        )
    return a.reshape(n, -1, a.shape[-1])


def capture_forward(
    model: nn.Module, x: Tensor, layers: Sequence[tuple[str, AffineLayer]]
) -> tuple[Any, list[LayerCapture]]:
    """Run ``model(x)`` recording each layer's input and output; hooks are removed in ``finally``.

    Returns the model's raw output (select the logits with
    :func:`stepscope.probe.outputs.select_logits`). The forward hook returns a clone of the
    output so that an in-place activation downstream (``ReLU(inplace=True)``) cannot overwrite
    the tensor we differentiate at.
    """
    records: dict[str, list[tuple[Tensor, Tensor]]] = {name: [] for name, _ in layers}

    def make_hook(name: str) -> Callable[..., Tensor]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
            records[name].append((args[0], output))
            return output.clone()

        return hook

    handles = [m.register_forward_hook(make_hook(name)) for name, m in layers]
    try:
        out = model(x)
    finally:
        for h in handles:
            h.remove()
    captures = []
    n = x.shape[0]
    for name, module in layers:
        calls = records[name]
        if len(calls) > 1:
            raise Refusal(
                "curvature_weight_shared",
                f"layer {name!r} ran {len(calls)} times in one forward pass; its curvature block "
                "would need every call (weight sharing)",
                ["analyse a model without module reuse", f"or leave {name!r} out via layers=[...]"],
            )
        if not calls:
            raise Refusal(
                "curvature_model_unsupported",
                f"layer {name!r} ran 0 times in one forward pass",
                ["remove unused layers from the analysed model", "or name layers=[...]"],
            )
        a, z = calls[0]
        captures.append(LayerCapture(name, module, _patches(name, module, a.detach(), n), z))
    return out, captures


def kfac_factor_rows(
    inputs: Tensor, backprop: Tensor, approx: KfacApprox
) -> tuple[Tensor, int, Tensor]:
    """``(A rows, A normaliser, B rows)`` with :math:`\\bar A = A^\\top A / norm`, :math:`\\bar B =
    B^\\top B / n`, for ``inputs (n, P, D)`` and ``backprop (K, n, P, d_out)``."""
    n, positions, d = inputs.shape
    if approx is KfacApprox.REDUCE:
        return inputs.mean(1), n, backprop.sum(2).reshape(-1, backprop.shape[-1])
    return inputs.reshape(-1, d), n * positions, backprop.reshape(-1, backprop.shape[-1])


def backprop_factors(
    logits: Tensor, captures: Sequence[LayerCapture], directions: Tensor
) -> list[Tensor]:
    """Backpropagate each output direction to every layer output.

    Parameters
    ----------
    logits
        ``(n, C)`` (or ``(n, T, C)``) logits still attached to the graph.
    captures
        From :func:`capture_forward`.
    directions
        ``(K, *logits.shape)`` per-example output directions.

    Returns
    -------
    list of Tensor
        Per layer, ``(K, n, P, d_out)`` rows :math:`B_{ikp} = J_{z_{ip}}^\\top v_{ik}` (``P``
        output positions of a Conv2d or sequence positions of a Linear / Conv1D).
    """
    outputs = [c.outputs for c in captures]
    per_direction = []
    for k in range(directions.shape[0]):
        grads = torch.autograd.grad(
            logits, outputs, grad_outputs=directions[k], retain_graph=True, allow_unused=True
        )
        for c, g in zip(captures, grads):
            if g is None:
                raise Refusal(
                    "curvature_model_unsupported",
                    f"layer {c.name!r} does not influence the logits",
                    ["remove unused layers from the analysed model"],
                )
        per_direction.append(grads)
    out = []
    for j, cap in enumerate(captures):
        b = torch.stack([d[j] for d in per_direction])
        if isinstance(cap.module, nn.Conv2d):  # (K, n, C_out, H', W') -> (K, n, P, C_out)
            b = b.flatten(3).transpose(2, 3)
        else:  # (K, n, ..., d_out) -> (K, n, P, d_out)
            b = b.reshape(b.shape[0], b.shape[1], -1, b.shape[-1])
        out.append(b)
    return out


def _entropy_rank(eigs: Tensor) -> float | None:
    pos = eigs.clamp(min=0)
    total = pos.sum()
    if total <= 0:
        return None
    w = pos[pos > 0] / total
    return float(torch.exp(-(w * w.log()).sum()))


def _subspace_top(
    gram_apply: Callable[[Tensor], Tensor], dim: int, k: int, seed: int, like: Tensor
) -> tuple[Tensor, int, float]:
    """Block subspace iteration with Rayleigh-Ritz for the top ``k`` eigenvalues of a PSD map."""
    gen = torch.Generator().manual_seed(seed)  # private CPU generator: global RNG untouched
    start = torch.randn(dim, k, generator=gen, dtype=like.dtype).to(like.device)
    q = torch.linalg.qr(start)[0]
    dtype = like.dtype
    residual = math.inf
    iters = 0
    for iters in range(1, 501):  # noqa: B007 - the final count is reported
        z = gram_apply(q)
        q = torch.linalg.qr(z)[0]
        t = q.T @ gram_apply(q)
        vals, vecs = torch.linalg.eigh((t + t.T) / 2)
        ritz = q @ vecs
        res = gram_apply(ritz) - ritz * vals
        top = vals.abs().max().clamp(min=torch.finfo(dtype).tiny)
        residual = float(res.norm(dim=0).max() / top)
        if residual < 1e-10:
            break
    return vals.flip(0), iters, residual


def factor_spectrum(rows: Tensor, n: int, eig_max_dimension: int, seed: int = 0) -> dict[str, Any]:
    """Spectrum and scalar summaries of ``X^T X / n`` from its tall factor ``X``.

    .. math::

        \\operatorname{erank} = \\exp\\Big(-\\sum_j w_j \\log w_j\\Big),\\ w_j = \\lambda_j /
        \\textstyle\\sum \\lambda \\ (\\text{Roy--Vetterli}), \\qquad
        \\operatorname{srank} = \\sum \\lambda^2 / \\lambda_{\\max}^2

    Parameters
    ----------
    rows
        ``(m, d)`` factor rows (e.g. ``A`` or the stacked backprop rows).
    n
        Normaliser (number of examples).
    eig_max_dimension
        Largest dense eigenproblem allowed; above it the top :data:`APPROX_TOP_K` eigenvalues come
        from a block subspace iteration and the effective rank is ``None``.

    Returns
    -------
    dict
        ``eigenvalues`` (descending; the non-zero part), ``dimension``, ``eigenproblem_dimension``,
        ``implicit_zero_eigenvalues``, ``method``, ``trace``, ``frobenius``, ``top_eigenvalue``,
        ``effective_rank``, ``stable_rank`` and, for the approximate method, its iteration record.
    """
    m, d = rows.shape
    small = min(m, d)
    trace = float((rows * rows).sum() / n)
    use_gram = m < d

    def gram_apply(v: Tensor) -> Tensor:
        if use_gram:
            return rows @ (rows.T @ v) / n
        return rows.T @ (rows @ v) / n

    out: dict[str, Any] = {
        "dimension": d,
        "eigenproblem_dimension": small,
        "implicit_zero_eigenvalues": d - small,
        "trace": trace,
    }
    if small <= eig_max_dimension:
        mat = rows @ rows.T / n if use_gram else rows.T @ rows / n
        eigs = torch.linalg.eigvalsh((mat + mat.T) / 2).flip(0)
        frob = float(eigs.norm())
        top = float(eigs[0]) if small else 0.0
        out.update(
            method=EXACT_METHOD, eigenvalues=eigs.tolist(), effective_rank=_entropy_rank(eigs)
        )
    else:
        k = min(APPROX_TOP_K, small)
        eigs, iters, residual = _subspace_top(gram_apply, small, k, seed, rows)
        mat = rows @ rows.T / n if use_gram else rows.T @ rows / n  # Frobenius is exact either way
        frob = float(mat.norm())
        top = float(eigs[0])
        out.update(
            method=APPROX_METHOD,
            approximate=True,
            top_k=k,
            iterations=iters,
            max_relative_ritz_residual=residual,
            converged=residual < 1e-10,
            eigenvalues=eigs.tolist(),
            effective_rank=None,
            effective_rank_undefined_reason="only the top-k spectrum was computed",
        )
    out["frobenius"] = frob
    out["top_eigenvalue"] = top
    out["stable_rank"] = (frob / top) ** 2 if top > 0 else None
    return out

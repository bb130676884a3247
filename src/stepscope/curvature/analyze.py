"""``analyze_curvature``: offline Fisher / GGN / Jacobian-Gram block analysis of one model.

Conventions (``g_i`` the gradient of example ``i``'s CE loss, sum reduction per example; ``J_i`` the
Jacobian of its logits; ``H_i`` its CE logit Hessian), each restricted to a layer's weight block
(``W[out, in]``, row-major ``vec``) or bias block, never including weight-bias cross terms:

.. math::

    F_{emp} = \\frac1n\\sum_i g_i g_i^\\top,\\qquad
    G_{CE} = \\frac1n\\sum_i J_i^\\top H_i J_i,\\qquad
    J_{Gram} = \\frac1n\\sum_i J_i^\\top J_i .

Result layout (every value JSON-ready)::

    {"metadata": {...},
     "layers": {name: {"activation_factor": SPECTRUM,
                       "empirical_fisher": F, "ce_ggn": F, "jacobian_gram": F}},
     "directional": {name: {"gradient_moments": {...}, family: {...}}},
     "output_space": {...}}

- ``SPECTRUM`` (:func:`stepscope.curvature.factors.factor_spectrum`): ``eigenvalues`` of
  :math:`\\bar A = \\frac1n\\sum_i a_i a_i^\\top` (descending, non-zero part), ``trace``,
  ``frobenius``, ``top_eigenvalue``, ``effective_rank`` (Roy–Vetterli :math:`\\exp` of the entropy of
  :math:`\\lambda/\\sum\\lambda`), ``stable_rank`` (:math:`\\sum\\lambda^2/\\lambda_{\\max}^2`),
  ``dimension``, ``eigenproblem_dimension``, ``implicit_zero_eigenvalues``, ``method``.
- ``F`` (:func:`stepscope.curvature.families.block_metrics`): ``weight`` and ``bias`` (``None``
  without bias) each ``{"diag_max", "frobenius", "trace", "average"}`` of the exact block diagonal
  (``frobenius`` is the 2-norm of the diagonal); ``kfac`` ``{"trace", "frobenius",
  "top_eigenvalue", "effective_rank", "stable_rank", "relative_diagonal_error"}`` of the
  normalised :math:`\\bar B \\otimes \\bar A`; ``backprop_factor``: the ``SPECTRUM`` of
  :math:`\\bar B`.
- ``directional``: :mod:`stepscope.curvature.quotients`. ``output_space``:
  :mod:`stepscope.curvature.output_space`.

"Exact" means exact block diagonals/traces and exact factor spectra on the given probe under
float64 arithmetic with all output directions; it is *not* an exact full matrix (KFAC drops the
activation/derivative dependence and all cross-layer structure).

Example
-------
>>> import torch, stepscope as ss
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<...>
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
>>> out = ss.analyze_curvature(model, torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 1]))
>>> sorted(out["layers"]["0"])
['activation_factor', 'ce_ggn', 'empirical_fisher', 'jacobian_gram']
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from stepscope._purity import float64_copy, preserved_state
from stepscope.codec import parse_enum
from stepscope.curvature.factors import (
    APPROX_METHOD,
    KfacApprox,
    affine_layers,
    backprop_factors,
    capture_forward,
    factor_spectrum,
    kfac_factor_rows,
    out_features,
)
from stepscope.curvature.families import (
    ESTIMATOR_LABELS,
    CurvatureFamily,
    CurvatureMode,
    block_metrics,
    output_directions,
    place_directions,
)
from stepscope.curvature.output_space import DEFAULT_SUPPORT_RTOL, output_space_mismatch
from stepscope.curvature.precision import watch_precision
from stepscope.curvature.quotients import layer_directional
from stepscope.defaults import DEFAULT_SEED
from stepscope.denominators import RULE
from stepscope.errors import Refusal
from stepscope.probe.legacy import OMITTED_LEGACY, legacy_names
from stepscope.probe.outputs import OutputSelector, ScoredTargets, score_targets, select_logits
from stepscope.probe.selection import probe_hash

SCHEMA = "stepscope.curvature.v1"
_LOG = logging.getLogger(__name__)


def _validate(x: Tensor, y: Tensor, mode: CurvatureMode, samples: int, eig_max: int) -> None:
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise Refusal("curvature_input_invalid", "x and y must be tensors", ["pass torch tensors"])
    if x.ndim < 1 or x.shape[0] < 1:
        raise Refusal(
            "curvature_input_invalid", f"x has shape {tuple(x.shape)}", ["pass (n, ...) inputs"]
        )
    if (
        y.ndim not in (1, 2)
        or y.shape[0] != x.shape[0]
        or y.dtype not in (torch.int64, torch.int32)
    ):
        raise Refusal(
            "curvature_input_invalid",
            f"y must be integer class labels ({x.shape[0]},) or token labels ({x.shape[0]}, T), "
            f"got {tuple(y.shape)} {y.dtype}",
            ["pass y as an int64 tensor aligned with x"],
        )
    # derivatives are taken with respect to parameters: integer inputs (token ids) are fine
    if x.is_complex() or x.dtype == torch.bool:
        raise Refusal(
            "curvature_input_invalid", f"x has dtype {x.dtype}", ["pass real or integer inputs"]
        )
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise Refusal("curvature_input_invalid", "x must be finite", ["clean x of nan/inf"])
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise Refusal("curvature_input_invalid", f"samples={samples!r}", ["pass an integer >= 1"])
    if mode is CurvatureMode.EXACT and samples != 1:
        raise Refusal(
            "curvature_mode_invalid",
            f"samples={samples} applies to mode='sampled' only; exact mode uses every direction",
            ["use mode='sampled' for sampled directions", "or drop samples"],
        )
    if eig_max < 1:
        raise Refusal("curvature_input_invalid", f"eig_max_dimension={eig_max}", ["pass >= 1"])


def probe_sha256(x: Tensor, y: Tensor) -> str:
    """sha256 of the raw bytes of ``x`` then ``y`` (as given, before any cast): the same digest as
    the dense probe's :func:`stepscope.probe.probe_hash`, so the recorder's probe identity and a
    panel's probe can be compared."""
    return probe_hash(x, y)


def analyze_curvature(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    mode: str = "exact",
    samples: int = 1,
    seed: int = DEFAULT_SEED,
    probe_id: str | None = None,
    eig_max_dimension: int = 1536,
    include_directional: bool = True,
    output: OutputSelector = None,
    next_token: bool = False,
    kfac_approx: str = "expand",
    layers: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Analyse a classifier's or language model's per-layer curvature blocks, in float64.

    Parameters
    ----------
    model
        Maps ``x`` to ``(n, C)`` logits (or ``(n, T, C)`` with token labels); its
        ``nn.Linear`` and HF ``Conv1D`` (on ``(n, D)`` or ``(n, ..., D)`` inputs) and
        ``nn.Conv2d`` (``groups=1``, numeric zero padding) layers are analysed; other
        convolutions refuse ``curvature_model_unsupported``, a layer that runs twice or shares
        a parameter with another module refuses ``curvature_weight_shared``. It is never
        modified: the work happens on a float64 deep copy in eval mode, and modes, ``.grad``,
        ``requires_grad`` and every RNG state are restored.
    x, y
        Probe inputs ``(n, ...)`` (floating, or integer token ids) and integer labels ``(n,)``,
        or ``(n, T)`` token labels (``-100`` not scored). One example is one sequence: its loss
        is the sum over its scored positions; every family is normalised by ``n``.
    mode
        ``"exact"`` (all output directions) or ``"sampled"`` (Rademacher combinations, GGN and
        Jacobian Gram only; the empirical Fisher is exact in both).
    samples
        Sampled directions per example (``"sampled"`` only).
    seed
        Seeds a private generator for sampled directions and approximate eigensolvers.
    probe_id
        Free-form label recorded in the metadata.
    eig_max_dimension
        Largest dense eigenproblem; larger factors get a labelled top-k approximation.
    include_directional
        Compute the directional quotients (:mod:`stepscope.curvature.quotients`).
    output
        ``None``, a key (``"logits"`` of a dict / HF ``ModelOutput``) or a callable selecting
        the logits from the model's output.
    next_token
        Token labels with the causal-LM shift (logits at ``t`` predict the label at ``t + 1``).
    kfac_approx
        ``"expand"`` or ``"reduce"`` (Eschenhagen et al. 2023) for layers with positions;
        identical for one position (:mod:`stepscope.curvature.factors`).
    layers
        Qualified names of the layers to analyse (default: every supported layer).

    Returns
    -------
    dict
        JSON-ready; layout and every key are defined in the module docstring.
    """
    start = time.perf_counter()
    mode_enum = parse_enum(CurvatureMode, mode, "curvature mode", "curvature_mode_invalid")
    approx = parse_enum(KfacApprox, kfac_approx, "kfac_approx", "curvature_mode_invalid")
    _validate(x, y, mode_enum, samples, eig_max_dimension)
    supplied_dtype = next((p.dtype for p in model.parameters()), None)
    prev_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        # autograd is needed even when called under no_grad() or inference_mode()
        with preserved_state(model), torch.inference_mode(False), torch.enable_grad():
            result = _analyze(
                model,
                x,
                y,
                mode_enum,
                samples,
                seed,
                eig_max_dimension,
                include_directional,
                _Targets(output, next_token, approx, layers),
            )
    finally:
        torch.set_float32_matmul_precision(prev_precision)
    meta = result["metadata"]
    meta.update(
        schema=SCHEMA,
        mode=mode_enum.value,
        samples=samples,
        seed=seed,
        probe_id=probe_id,
        probe_sha256=probe_sha256(x, y),
        probe_size=int(x.shape[0]),
        supplied_model_dtype=str(supplied_dtype),
        supplied_input_dtype=str(x.dtype),
        float32_matmul_precision_during_analysis="highest",
        reduction_dtype="float64",
    )
    undefined = _undefined_values(result)
    meta["undefined_values"] = {"count": len(undefined), "paths": undefined}
    meta["elapsed_s"] = time.perf_counter() - start
    _LOG.info(
        "analyze_curvature: %d layers, largest eigenproblem %d (%s), %.2f s",
        len(result["layers"]),
        meta["largest_eigenproblem_dimension"],
        meta["largest_eigenproblem"],
        meta["elapsed_s"],
    )
    return result


#: keys whose ``None`` means "absent by construction", not "undefined ratio"
_NONE_BY_DESIGN = {"bias", "probe_id", "directional", "censored"}


def _undefined_values(tree: Any, path: str = "") -> list[str]:
    """Dotted paths of every ``None`` that stands for an undefined quantity (zero denominator,
    empty set, truncated spectrum), so the validity of a result is countable at a glance."""
    if isinstance(tree, dict):
        out: list[str] = []
        for key, value in tree.items():
            if key == "metadata" or (value is None and key in _NONE_BY_DESIGN):
                continue
            out += _undefined_values(value, f"{path}.{key}" if path else str(key))
        return out
    return [path] if tree is None else []


def _layer_shape(cap: Any) -> dict[str, Any]:
    m = cap.module
    shape: dict[str, Any] = {
        "kind": type(m).__name__,
        "d_in": int(cap.inputs.shape[-1]),
        "d_out": out_features(m),
        "positions": int(cap.inputs.shape[1]),
        "bias": m.bias is not None,
    }
    if isinstance(m, nn.Conv2d):
        shape.update(kernel_size=list(m.kernel_size), stride=list(m.stride))
    return shape


@dataclass(frozen=True)
class _Targets:
    """How outputs are read and factored: logit selector, LM shift, KFAC convention, layers."""

    output: OutputSelector
    next_token: bool
    approx: KfacApprox
    layers: Sequence[str] | None


def _directions(
    family: CurvatureFamily,
    scored: ScoredTargets,
    mode: CurvatureMode,
    samples: int,
    gen: torch.Generator,
) -> Tensor:
    """``(K, *target_shape)`` directions: per example for class labels, placed per position for
    token labels (:func:`stepscope.curvature.families.place_directions`)."""
    rows = scored.logits.detach()
    v = output_directions(family, rows, scored.labels, mode, samples, gen)
    if scored.keep is None:  # class labels (``keep`` is set exactly for token labels)
        return v
    exact_rows = mode is CurvatureMode.EXACT and family is not CurvatureFamily.EMPIRICAL_FISHER
    return place_directions(v, scored.keep, per_position=exact_rows)


def _analyze(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    mode: CurvatureMode,
    samples: int,
    seed: int,
    eig_max: int,
    include_directional: bool,
    targets: _Targets,
) -> dict[str, Any]:
    work = float64_copy(model).eval()
    for p in work.parameters():
        p.requires_grad_(True)
    xd = x.detach().to(torch.float64) if x.is_floating_point() else x.detach()
    unsupported: dict[str, dict[str, str]] = {}
    layers = affine_layers(work, targets.layers, unsupported)
    names = dict(layers)
    with watch_precision(work, torch.float64) as lowered:
        raw, captures = capture_forward(work, xd, layers)
    logits = select_logits(raw, targets.output, "curvature_model_unsupported")
    scored = score_targets(
        logits,
        y.to(torch.int64),
        next_token=targets.next_token,
        code="curvature_model_unsupported",
        label_code="curvature_input_invalid",
    )
    target = logits[:, :-1] if targets.next_token else logits  # what the directions apply to
    n, c = x.shape[0], logits.shape[-1]
    flat, labels = scored.logits.detach(), scored.labels
    gen = torch.Generator().manual_seed(seed)
    if mode is CurvatureMode.EXACT:
        # one pass per output unit gives every layer's Jacobian; each family is a mix of it
        jac = backprop_factors(
            target, captures, _directions(CurvatureFamily.JACOBIAN_GRAM, scored, mode, samples, gen)
        )
        per_family = {CurvatureFamily.JACOBIAN_GRAM: jac}
        for fam in (CurvatureFamily.EMPIRICAL_FISHER, CurvatureFamily.CE_GGN):
            v = _directions(fam, scored, mode, samples, gen)
            v = v.reshape(v.shape[0], n, -1)  # (K, n, outputs): outputs index jac's directions
            per_family[fam] = [torch.einsum("knc,cnpd->knpd", v, j) for j in jac]
        passes = jac[0].shape[0] if jac else 0
    else:
        per_family = {}
        passes = 0
        for fam in CurvatureFamily:
            v = _directions(fam, scored, mode, samples, gen)
            per_family[fam] = backprop_factors(target, captures, v)
            passes += v.shape[0]
    layers_out: dict[str, Any] = {}
    directional: dict[str, Any] = {}
    eigenproblems: list[dict[str, Any]] = []

    def spectrum(rows: Tensor, label: str, norm: int) -> dict[str, Any]:
        sp = factor_spectrum(rows, norm, eig_max, seed)
        eigenproblems.append(
            {"factor": label, "dimension": sp["eigenproblem_dimension"], "method": sp["method"]}
        )
        return sp

    approx = targets.approx
    for j, cap in enumerate(captures):
        a = cap.inputs  # (n, P, D)
        a_rows, a_norm, _ = kfac_factor_rows(
            a, per_family[CurvatureFamily.EMPIRICAL_FISHER][j], approx
        )
        a_sp = spectrum(a_rows, f"{cap.name}/activation", a_norm)
        entry: dict[str, Any] = {"activation_factor": a_sp}
        has_bias = names[cap.name].bias is not None
        for fam in CurvatureFamily:
            rows = per_family[fam][j].detach()
            label = f"{cap.name}/{fam.value}/backprop"
            b_sp = spectrum(kfac_factor_rows(a, rows, approx)[2], label, n)
            entry[fam.value] = block_metrics(a, rows, has_bias, a_sp, b_sp, approx)
        layers_out[cap.name] = entry
        if include_directional:
            directional[cap.name] = layer_directional(
                a,
                {fam.value: per_family[fam][j].detach() for fam in CurvatureFamily},
                CurvatureFamily.EMPIRICAL_FISHER.value,
                approx,
            )
    largest = max(eigenproblems, key=lambda e: e["dimension"])
    predictions = flat.argmax(1)
    log_probs = torch.log_softmax(flat, 1)
    m = flat.shape[0]
    metadata = {
        "analysis_dtype": "float64",
        # "mixed" when a module computes below float64 inside the float64 copy (HF float32
        # norms / softmax): its factors and derivatives are only that precise
        "derivative_dtype": "mixed" if lowered else "float64",
        "lower_precision_internals": lowered,
        "model_mode_during_analysis": "eval",
        "num_classes": c,
        "targets": "tokens" if scored.sequence else "classes",
        "next_token": targets.next_token,
        "scored_targets": m,
        # None (counted in undefined_values) when every label is ignored (-100): m == 0
        "probe_cross_entropy_mean": float(-log_probs[torch.arange(m), labels].mean())
        if m
        else None,
        "probe_accuracy_fraction": float((predictions == labels).double().mean()) if m else None,
        "estimators": {f.value: ESTIMATOR_LABELS[mode][f] for f in CurvatureFamily},
        "backward_passes": passes,
        "layer_shapes": {cap.name: _layer_shape(cap) for cap in captures},
        # layers left out of the default selection, with the reason (a tied LM head)
        "unsupported_layers": unsupported,
        # parameters outside the analysed layers (embeddings, norms, ...): not in any block
        "unanalysed_parameter_modules": {
            name: type(module).__name__
            for name, module in work.named_modules()
            if name not in names and any(True for _ in module.parameters(recurse=False))
        },
        "kfac_approx": approx.value,
        "kfac_convention": "Bbar (x) Abar; with positions (Conv2d output positions, sequence "
        "positions of Linear/Conv1D): expand = Abar averaged over examples and positions, Bbar "
        "summed over positions; reduce = Abar of the position-mean inputs, Bbar of the "
        "position-summed backprops (Eschenhagen et al. 2023); identical for one position",
        "sequence_convention": "one example = one sequence, loss summed over scored positions; "
        "families over scored outputs only; output_space over scored targets",
        "eig_max_dimension": eig_max,
        "largest_eigenproblem_dimension": largest["dimension"],
        "largest_eigenproblem": largest["factor"],
        "approximate_eigenproblems": [e for e in eigenproblems if e["method"] == APPROX_METHOD],
        "eigenproblems": eigenproblems,
        "cross_entropy_numerics": "1 - p_k computed as the sum of the other probabilities "
        "(no subtraction) in CE gradients and square-root Hessian factors",
        "output_support_rtol": DEFAULT_SUPPORT_RTOL,
        "negligible_denominator": RULE,
        "definitions": {
            "effective_rank": "Roy-Vetterli exp(entropy of lambda / sum lambda), eigenvalues "
            "clamped at 0; KFAC value = product over the two factors",
            "stable_rank": "sum lambda^2 / lambda_max^2 = |M|_F^2 / |M|_2^2",
            "intrinsic_dimension": "sum lambda / lambda_max (the legacy 'erank')",
            "weight.frobenius": "2-norm of the exact block diagonal (legacy diag_fro)",
            "kfac": "normalised Bbar (x) Abar with Abar = sum a a^T / n, Bbar = sum_k B B^T / n",
        },
        "legacy_names": {k: v.describe() for k, v in legacy_names("curvature").items()},
        "omitted_legacy_quantities": OMITTED_LEGACY,
    }
    return {
        "metadata": metadata,
        "layers": layers_out,
        "directional": directional if include_directional else None,
        "output_space": output_space_mismatch(flat, labels) if m else None,
    }

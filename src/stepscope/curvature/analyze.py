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
from typing import Any

import torch
from torch import Tensor, nn

from stepscope._purity import float64_copy, preserved_state
from stepscope.curvature.factors import (
    APPROX_METHOD,
    affine_layers,
    backprop_factors,
    capture_forward,
    factor_spectrum,
)
from stepscope.curvature.families import (
    ESTIMATOR_LABELS,
    CurvatureMode,
    Family,
    block_metrics,
    ce_hessian_sqrt,
    ce_logit_gradient,
    output_directions,
    parse_mode,
)
from stepscope.curvature.output_space import DEFAULT_SUPPORT_RTOL, output_space_mismatch
from stepscope.curvature.quotients import layer_directional
from stepscope.denominators import RULE
from stepscope.errors import Refusal
from stepscope.probe.selection import probe_hash

SCHEMA = "stepscope.curvature.v1"
_LOG = logging.getLogger(__name__)

#: canonical key -> the legacy name it replaces (docs/LEGACY_METRICS.md)
LEGACY_NAMES: dict[str, str] = {
    "layers.*.{family}.weight.diag_max": "layer-{i}/{hessian,jacobian,fisher}/diag_l2",
    "layers.*.{family}.weight.frobenius": "layer-{i}/{family}/diag_fro",
    "layers.*.{family}.weight.trace": "layer-{i}/{family}/diag_trace; hess_trace, jac_trace",
    "layers.*.{family}.weight.average": "layer-{i}/{family}/diag_average",
    "layers.*.{family}.kfac.trace": "layer-{i}/{family}/kfac_trace (legacy used unnormalised sums)",
    "layers.*.{family}.kfac.relative_diagonal_error": "layer-{i}/{family}/kfac_error",
    "layers.*.{family}.kfac.top_eigenvalue": "hess_l2, jac_l2, fish_l2",
    "layers.*.activation_factor.eigenvalues": "hess_A/jac_A/fish_A spectra (one shared A)",
    "layers.*.{family}.backprop_factor.eigenvalues": "hess_B, jac_B, fish_B spectra",
    "directional.*.gradient_moments.mean_gradient_frobenius": "layer-{i}/grad_fro",
    "directional.*.gradient_moments.mean_gradient_sq_norm": "layer-{i}/enorms",
    "directional.*.gradient_moments.covariance_trace": "layer-{i}/norms_centered",
    "directional.*.gradient_moments.gradient_diversity": "diversity / n (Yin et al.)",
    "directional.*.gradient_moments.gradient_diversity_legacy_scale": "layer-{i}/fisher/diversity",
    "directional.*.ce_ggn.mean_gradient_rayleigh_quotient": "hess_curv",
    "directional.*.jacobian_gram.mean_gradient_rayleigh_quotient": "jac_curv",
    "directional.*.{family}.per_example_rayleigh_quotient": "{hess,jac,sigma}_curv_grad, _max, _median",
    "directional.*.ce_ggn.weighted_gradient_norm_mean": "norms_hess",
    "directional.*.jacobian_gram.weighted_gradient_sq_norm_mean": "norms_jac",
    "directional.*.{family}.factorized_noise_contraction": "hess_noise, jac_noise",
    "directional.*.{family}.factorized_noise_contraction_centered": "*_noise_centered",
    "output_space.lyapunov.rho_ambient": "mismatch/rho",
    "output_space.preconditioned_fisher.rho_ambient": "mismatch/rho_cheap",
    "output_space.lyapunov_to_preconditioned_intrinsic_dimension_ratio": "mismatch/diagonalizability",
}

#: legacy quantities deliberately not reproduced, with the reason
OMITTED_LEGACY: dict[str, str] = {
    "kfac_fro": "unnormalised factor sums (n^2 times the normalised value); kfac.frobenius replaces it",
    "*_erank (trace/top)": "was an intrinsic dimension, not an entropy rank; see effective_rank and "
    "output_space.*.intrinsic_dimension",
    "lyap_hess_ave, lyap_jac_ave": "read accumulator fields that were never written (always 0)",
    "band_bottou_stoch": "read an unwritten field (always 0)",
    "lr1, lr2, lr3, lr4": "heuristic learning-rate prescriptions; lr1/lr2 divide by n twice",
    "openai_gradient_noise": "square-root accumulator mislabelled as a gradient-noise scale; see "
    "gradient_moments.simple_noise_scale",
    "band_bottou, band_yaida, band_yaida_centered, jain1_*, jain2_*": "heuristic rates, unaudited",
    "regrets, pairwise cosines": "expensive offset-regret predictions; absolute cosines",
    "hist_fish_eig, hist_jac_eig": "duplicated the Hessian eigenvalue products",
    "Kronecker-product eigenvalue lists": "up to millions of values per layer; factor spectra "
    "and their products are reported instead",
    "mean_norm": "sqrt(sum |g_i|^2)/n is neither mean nor RMS; see per_example_norm",
}


def _validate(x: Tensor, y: Tensor, mode: CurvatureMode, samples: int, eig_max: int) -> None:
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise Refusal("curvature_input_invalid", "x and y must be tensors", ["pass torch tensors"])
    if x.ndim < 1 or x.shape[0] < 1:
        raise Refusal(
            "curvature_input_invalid", f"x has shape {tuple(x.shape)}", ["pass (n, ...) inputs"]
        )
    if y.ndim != 1 or y.shape[0] != x.shape[0] or y.dtype not in (torch.int64, torch.int32):
        raise Refusal(
            "curvature_input_invalid",
            f"y must be integer class labels of shape ({x.shape[0]},), got {tuple(y.shape)} "
            f"{y.dtype}",
            ["pass y as a 1-D int64 tensor aligned with x"],
        )
    if not x.is_floating_point() or not torch.isfinite(x).all():
        raise Refusal(
            "curvature_input_invalid", "x must be a finite floating tensor", ["cast and clean x"]
        )
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
    seed: int = 20260909,
    probe_id: str | None = None,
    eig_max_dimension: int = 1536,
    include_directional: bool = True,
) -> dict[str, Any]:
    """Analyse a classifier's per-layer curvature blocks on a fixed probe, in float64.

    Parameters
    ----------
    model
        Maps ``x`` to ``(n, C)`` logits; its ``nn.Linear`` and ``nn.Conv2d`` (``groups=1``,
        numeric zero padding; KFAC-expand) layers are analysed; other convolutions refuse
        ``curvature_model_unsupported``. It is never modified: the work happens on a
        float64 deep copy in eval mode, and modes, ``.grad``, ``requires_grad`` and every RNG
        state are restored.
    x, y
        Probe inputs ``(n, ...)`` and integer labels ``(n,)``.
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

    Returns
    -------
    dict
        JSON-ready; layout and every key are defined in the module docstring.
    """
    start = time.perf_counter()
    mode_enum = parse_mode(mode)
    _validate(x, y, mode_enum, samples, eig_max_dimension)
    supplied_dtype = next((p.dtype for p in model.parameters()), None)
    prev_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        # autograd is needed even when called under no_grad() or inference_mode()
        with preserved_state(model), torch.inference_mode(False), torch.enable_grad():
            result = _analyze(
                model, x, y, mode_enum, samples, seed, eig_max_dimension, include_directional
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
        derivative_dtype="float64",
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
        "d_out": int(m.weight.shape[0]),
        "positions": int(cap.inputs.shape[1]),
        "bias": m.bias is not None,
    }
    if isinstance(m, nn.Conv2d):
        shape.update(kernel_size=list(m.kernel_size), stride=list(m.stride))
    return shape


def _analyze(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    mode: CurvatureMode,
    samples: int,
    seed: int,
    eig_max: int,
    include_directional: bool,
) -> dict[str, Any]:
    work = float64_copy(model).eval()
    for p in work.parameters():
        p.requires_grad_(True)
    xd = x.detach().to(torch.float64)
    layers = affine_layers(work)
    names = dict(layers)
    logits, captures = capture_forward(work, xd, layers)
    if logits.ndim != 2 or logits.shape[0] != x.shape[0]:
        raise Refusal(
            "curvature_model_unsupported",
            f"the model output has shape {tuple(logits.shape)}; expected (n, C) logits",
            ["wrap the model so it returns (n, C) logits"],
        )
    n, c = logits.shape
    if int(y.min()) < 0 or int(y.max()) >= c:
        raise Refusal("curvature_input_invalid", f"labels outside [0, {c})", ["check y"])
    labels = y.to(torch.int64)
    flat = logits.detach()
    gen = torch.Generator().manual_seed(seed)
    if mode is CurvatureMode.EXACT:
        # one pass per output unit gives every layer's Jacobian; each family is a mix of it
        jac = backprop_factors(
            logits,
            captures,
            output_directions(Family.JACOBIAN_GRAM, flat, labels, mode, samples, gen),
        )
        mix = {
            Family.EMPIRICAL_FISHER: ce_logit_gradient(flat, labels).unsqueeze(0),
            Family.CE_GGN: ce_hessian_sqrt(flat).permute(1, 0, 2),
        }
        per_family = {Family.JACOBIAN_GRAM: jac}
        for fam, v in mix.items():
            per_family[fam] = [torch.einsum("knc,cnpd->knpd", v, j) for j in jac]
        passes = c
    else:
        per_family = {}
        passes = 0
        for fam in Family:
            v = output_directions(fam, flat, labels, mode, samples, gen)
            per_family[fam] = backprop_factors(logits, captures, v)
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

    for j, cap in enumerate(captures):
        a = cap.inputs  # (n, P, D)
        positions = a.shape[1]
        a_sp = spectrum(a.reshape(-1, a.shape[-1]), f"{cap.name}/activation", n * positions)
        entry: dict[str, Any] = {"activation_factor": a_sp}
        for fam in Family:
            rows = per_family[fam][j].detach()
            label = f"{cap.name}/{fam.value}/backprop"
            b_sp = spectrum(rows.reshape(-1, rows.shape[-1]), label, n)
            entry[fam.value] = block_metrics(a, rows, names[cap.name].bias is not None, a_sp, b_sp)
        layers_out[cap.name] = entry
        if include_directional:
            directional[cap.name] = layer_directional(
                a,
                {fam.value: per_family[fam][j].detach() for fam in Family},
                Family.EMPIRICAL_FISHER.value,
            )
    largest = max(eigenproblems, key=lambda e: e["dimension"])
    predictions = flat.argmax(1)
    log_probs = torch.log_softmax(flat, 1)
    metadata = {
        "analysis_dtype": "float64",
        "model_mode_during_analysis": "eval",
        "num_classes": c,
        "probe_cross_entropy_mean": float(-log_probs[torch.arange(n), labels].mean()),
        "probe_accuracy_fraction": float((predictions == labels).double().mean()),
        "estimators": {f.value: ESTIMATOR_LABELS[mode][f] for f in Family},
        "backward_passes": passes,
        "layer_shapes": {cap.name: _layer_shape(cap) for cap in captures},
        "kfac_convention": "Linear: Bbar (x) Abar; Conv2d: KFAC-expand (Grosse & Martens 2016), "
        "Abar averaged over examples and output positions, Bbar summed over positions",
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
        "legacy_names": LEGACY_NAMES,
        "omitted_legacy_quantities": OMITTED_LEGACY,
    }
    return {
        "metadata": metadata,
        "layers": layers_out,
        "directional": directional if include_directional else None,
        "output_space": output_space_mismatch(flat, labels),
    }

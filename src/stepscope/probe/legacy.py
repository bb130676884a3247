"""The legacy metric names: which legacy quantity each stepscope output replaces, in one table.

The dense probe (:class:`~stepscope.probe.ProbeRecord`, per weight block) and the offline curvature
analysis (:func:`~stepscope.curvature.analyze_curvature`, result paths) both replace quantities of
the legacy per-layer metrics described in ``docs/LEGACY_METRICS.md``. :data:`LEGACY_NAMES` maps
each of our outputs to the legacy name and how the two values relate; :data:`OMITTED_LEGACY` lists
the legacy quantities neither reproduces, with the reason. Each producer writes its own view into
its records (:func:`legacy_names`).

Example
-------
>>> LEGACY_NAMES["gradient_diversity"]
LegacyName(name='layer-{i}/fisher/diversity', relation='legacy = n * ours (Yin et al.)', producer='probe')
>>> legacy_names("curvature")["output_space.lyapunov.rho_ambient"].describe()
'mismatch/rho'
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Producer = Literal["probe", "curvature"]


class LegacyName(NamedTuple):
    """The legacy quantity one of our outputs replaces.

    Attributes
    ----------
    name
        The legacy name (``layer-{i}/...`` is per weight block ``i``).
    relation
        How our value relates to it (``"equal"``, ``"legacy = n * ours"``, ...; empty: not stated).
    producer
        Which part of stepscope writes the output: ``"probe"`` (a probe record key of a weight
        block) or ``"curvature"`` (a path in the curvature analysis result).
    """

    name: str
    relation: str
    producer: Producer

    def describe(self) -> str:
        """``name`` with the relation in parentheses when one is stated."""
        return f"{self.name} ({self.relation})" if self.relation else self.name


def _probe(name: str, relation: str) -> LegacyName:
    return LegacyName(name, relation, "probe")


def _curvature(name: str, relation: str = "") -> LegacyName:
    return LegacyName(name, relation, "curvature")


#: Our output (a probe record key, or a curvature result path) -> the legacy quantity it replaces.
LEGACY_NAMES: dict[str, LegacyName] = {
    # the dense probe, per weight block
    "fisher_trace": _probe("layer-{i}/fisher/diag_trace", "equal (legacy B at per-example scale)"),
    "mean_grad_sq_norm": _probe("layer-{i}/enorms", "equal"),
    "covariance_trace": _probe(
        "layer-{i}/norms_centered", "equal (ours clipped only for round-off)"
    ),
    "gradient_diversity": _probe("layer-{i}/fisher/diversity", "legacy = n * ours (Yin et al.)"),
    "gradient_diversity_legacy_scale": _probe(
        "layer-{i}/fisher/diversity", "equal (fisher / ||G||^2)"
    ),
    "grad_norm_rms": _probe("layer-{i}/mean_norm", "legacy = ours / sqrt(n)"),
    "grad_norm_quantiles.min": _probe("layer-{i}/min_norm", "equal"),
    "grad_norm_quantiles.median": _probe("layer-{i}/median_norm", "equal"),
    "grad_norm_quantiles.max": _probe("layer-{i}/max_norm", "equal"),
    "grad_fro_legacy_scale": _probe("layer-{i}/grad_fro", "equal (mean-loss gradient)"),
    "activation_zero_fraction": _probe(
        "layer-{i}/a_sparsity", "legacy counted entries <= 0; ours == 0"
    ),
    "backprop_zero_fraction": _probe(
        "layer-{i}/b_sparsity", "legacy counted entries <= 0; ours == 0"
    ),
    # the curvature analysis, by result path
    "layers.*.{family}.weight.diag_max": _curvature("layer-{i}/{hessian,jacobian,fisher}/diag_l2"),
    "layers.*.{family}.weight.frobenius": _curvature("layer-{i}/{family}/diag_fro"),
    "layers.*.{family}.weight.trace": _curvature(
        "layer-{i}/{family}/diag_trace; hess_trace, jac_trace"
    ),
    "layers.*.{family}.weight.average": _curvature("layer-{i}/{family}/diag_average"),
    "layers.*.{family}.kfac.trace": _curvature(
        "layer-{i}/{family}/kfac_trace", "legacy used unnormalised sums"
    ),
    "layers.*.{family}.kfac.relative_diagonal_error": _curvature("layer-{i}/{family}/kfac_error"),
    "layers.*.{family}.kfac.top_eigenvalue": _curvature("hess_l2, jac_l2, fish_l2"),
    "layers.*.activation_factor.eigenvalues": _curvature(
        "hess_A/jac_A/fish_A spectra", "one shared A"
    ),
    "layers.*.{family}.backprop_factor.eigenvalues": _curvature("hess_B, jac_B, fish_B spectra"),
    "directional.*.gradient_moments.mean_gradient_frobenius": _curvature("layer-{i}/grad_fro"),
    "directional.*.gradient_moments.mean_gradient_sq_norm": _curvature("layer-{i}/enorms"),
    "directional.*.gradient_moments.covariance_trace": _curvature("layer-{i}/norms_centered"),
    "directional.*.gradient_moments.gradient_diversity": _curvature("diversity / n", "Yin et al."),
    "directional.*.gradient_moments.gradient_diversity_legacy_scale": _curvature(
        "layer-{i}/fisher/diversity"
    ),
    "directional.*.ce_ggn.mean_gradient_rayleigh_quotient": _curvature("hess_curv"),
    "directional.*.jacobian_gram.mean_gradient_rayleigh_quotient": _curvature("jac_curv"),
    "directional.*.{family}.per_example_rayleigh_quotient": _curvature(
        "{hess,jac,sigma}_curv_grad, _max, _median"
    ),
    "directional.*.ce_ggn.weighted_gradient_norm_mean": _curvature("norms_hess"),
    "directional.*.jacobian_gram.weighted_gradient_sq_norm_mean": _curvature("norms_jac"),
    "directional.*.{family}.factorized_noise_contraction": _curvature("hess_noise, jac_noise"),
    "directional.*.{family}.factorized_noise_contraction_centered": _curvature("*_noise_centered"),
    "output_space.lyapunov.rho_ambient": _curvature("mismatch/rho"),
    "output_space.preconditioned_fisher.rho_ambient": _curvature("mismatch/rho_cheap"),
    "output_space.lyapunov_to_preconditioned_intrinsic_dimension_ratio": _curvature(
        "mismatch/diagonalizability"
    ),
}

#: Legacy quantities deliberately not reproduced (by the probe or the curvature analysis) -> why.
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


def legacy_names(producer: Producer) -> dict[str, LegacyName]:
    """The rows of :data:`LEGACY_NAMES` whose output ``producer`` writes."""
    return {k: v for k, v in LEGACY_NAMES.items() if v.producer == producer}

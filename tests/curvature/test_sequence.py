"""analyze_curvature and the Hessian probes on sequence / transformer models, float64 oracles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import stepscope as ss
from tests.probe.transformer_testkit import (
    TARGETS,
    curvature_oracle,
    make_transformer,
    make_transformer_data,
    per_example_gradients,
)

RTOL = 1e-10
FAMILIES = ("empirical_fisher", "ce_ggn", "jacobian_gram")
# (kind, analysed layers or None for all): the BERT-style Conv1d mixer is not a curvature layer
CASES = [
    ("gpt_untied", None),
    ("bert_unshared", ["block.query", "block.value", "block2.up", "pooler", "classifier"]),
    ("vit", None),
    ("hf_gpt2_untied", None),
    ("hf_bert", None),
]


def _data(kind: str, n: int = 4):
    x, y = make_transformer_data(kind, n=n)
    _, output, next_token = TARGETS[kind]
    return x, y, output, next_token


def _close(a: float, b: float, scale: float) -> bool:
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=RTOL * scale)


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def analysed(request):
    kind, layers = request.param
    if kind.startswith("hf_"):
        pytest.importorskip("transformers")
    model = make_transformer(kind)
    x, y, output, next_token = _data(kind)
    results = {
        approx: ss.analyze_curvature(
            model,
            x,
            y,
            output=output,
            next_token=next_token,
            kfac_approx=approx,
            layers=layers,
            include_directional=False,
        )
        for approx in ("expand", "reduce")
    }
    names = list(results["expand"]["layers"])
    oracle = curvature_oracle(model, x, y, output, next_token, names)
    return kind, model, results, oracle


def test_exact_diagonals_and_traces_match_per_logit_jacobians(analysed):
    _, _, results, oracle = analysed
    for name, layer in results["expand"]["layers"].items():
        for fam in FAMILIES:
            for part in ("weight", "bias"):
                ref = oracle[name][fam].get(part)
                got = layer[fam][part]
                if ref is None:
                    assert got is None
                    continue
                # the layer's weight scale: an attention key bias is an exact zero up to round-off
                scale = max(float(ref.abs().max()), float(oracle[name][fam]["weight"].abs().max()))
                assert _close(got["trace"], float(ref.sum()), scale), (name, fam, part)
                assert _close(got["diag_max"], float(ref.max()), scale), (name, fam, part)
                assert _close(got["frobenius"], float(ref.norm()), scale), (name, fam, part)
            # the exact diagonal does not depend on the KFAC convention
            assert results["reduce"]["layers"][name][fam]["weight"] == layer[fam]["weight"]


@pytest.mark.parametrize("approx", ["expand", "reduce"])
def test_kfac_factors_match_their_definitions(analysed, approx):
    _, model, results, oracle = analysed
    out = results[approx]
    assert out["metadata"]["kfac_approx"] == approx
    modules = dict(model.named_modules())
    # the model's KFAC scale per family: a block that is zero up to round-off (an attention key
    # at initialisation) is compared in absolute terms against it
    model_scale = {
        fam: max(
            float(o[f"A_{approx}"].trace() * o[fam][f"B_{approx}"].trace()) for o in oracle.values()
        )
        for fam in FAMILIES
    }
    for name, layer in out["layers"].items():
        if isinstance(modules[name], nn.Conv2d):
            continue  # receptive-field patches: covered by the curvlinops cross-check
        a = oracle[name][f"A_{approx}"]
        a_eigs = torch.linalg.eigvalsh(a).flip(0)
        got_a = torch.tensor(layer["activation_factor"]["eigenvalues"], dtype=torch.float64)
        torch.testing.assert_close(got_a, a_eigs[: len(got_a)], rtol=RTOL, atol=RTOL * a_eigs[0])
        for fam in FAMILIES:
            b = oracle[name][fam][f"B_{approx}"]
            k = layer[fam]["kfac"]
            scale = model_scale[fam]
            assert _close(k["trace"], float(a.trace() * b.trace()), scale), (name, fam)
            assert _close(k["frobenius"], float(a.norm() * b.norm()), scale), (name, fam)
            top = float(torch.linalg.eigvalsh(a)[-1] * torch.linalg.eigvalsh(b)[-1])
            assert _close(k["top_eigenvalue"], top, scale), (name, fam)
            diag = oracle[name][fam]["weight"]
            if isinstance(modules[name], nn.Linear):
                kron_diag = torch.outer(b.diagonal(), a.diagonal())
            else:  # HF Conv1D stores W^T
                kron_diag = torch.outer(a.diagonal(), b.diagonal())
            if float(a.trace() * b.trace()) > 1e-12 * scale:
                err = float((kron_diag - diag).abs().mean() / diag.abs().mean())
                assert math.isclose(k["relative_diagonal_error"], err, rel_tol=1e-8), (name, fam)


def test_expand_and_reduce_differ_with_positions_and_agree_without(analysed):
    _, _, results, _ = analysed
    differ = []
    for name, shape in results["expand"]["metadata"]["layer_shapes"].items():
        e = results["expand"]["layers"][name]["ce_ggn"]["kfac"]["trace"]
        r = results["reduce"]["layers"][name]["ce_ggn"]["kfac"]["trace"]
        if shape["positions"] == 1:
            assert math.isclose(e, r, rel_tol=1e-12)
        else:
            differ.append(not math.isclose(e, r, rel_tol=1e-6))
    assert differ and any(differ)


def test_tied_head_and_reused_block_refuse_naming_the_module_unless_left_out():
    x, y, output, next_token = _data("gpt")
    with pytest.raises(ss.Refusal, match=r"'lm_head' shares a parameter with module 'wte'") as err:
        ss.analyze_curvature(
            make_transformer("gpt"), x, y, output=output, next_token=next_token, layers=["lm_head"]
        )
    assert err.value.code == "curvature_weight_shared"
    out = ss.analyze_curvature(
        make_transformer("gpt"),
        x,
        y,
        output=output,
        next_token=next_token,
        layers=["block.c_attn", "block.mlp_proj"],
        include_directional=False,
    )
    assert sorted(out["layers"]) == ["block.c_attn", "block.mlp_proj"]
    xb, yb, output, _ = _data("bert")
    with pytest.raises(ss.Refusal, match=r"'block\.query' ran 2 times") as err:
        ss.analyze_curvature(
            make_transformer("bert"), xb, yb, output=output, layers=["block.query"]
        )
    assert err.value.code == "curvature_weight_shared"


def test_dict_output_needs_a_selector_and_token_inputs_are_accepted():
    model = make_transformer("gpt_untied")
    x, y, _, _ = _data("gpt_untied")
    assert not x.is_floating_point()
    with pytest.raises(ss.Refusal, match="keys \\['logits'\\]") as err:
        ss.analyze_curvature(model, x, y, next_token=True)
    assert err.value.code == "curvature_model_unsupported"
    out = ss.analyze_curvature(
        model, x, y, output=lambda o: o["logits"], next_token=True, include_directional=False
    )
    meta = out["metadata"]
    assert meta["targets"] == "tokens" and meta["scored_targets"] == int((y[:, 1:] != -100).sum())
    assert meta["layer_shapes"]["lm_head"]["positions"] == x.shape[1]
    assert meta["unanalysed_parameter_modules"]["wte"] == "Embedding"
    assert meta["unanalysed_parameter_modules"]["block.ln_1"] == "LayerNorm"


@pytest.mark.parametrize("kind", ["hessian", "ggn", "empirical_fisher"])
def test_hessian_probes_take_the_selector_and_the_sequence_loss(kind):
    model = make_transformer("gpt")  # tied head: the Hessian probes see whole parameters
    x, y, output, next_token = _data("gpt")
    params = dict(model.named_parameters())
    names = list(params)

    keep = (y[:, 1:] != -100).reshape(-1)

    def scored_logits(flat: torch.Tensor) -> torch.Tensor:
        tensors, pos = {}, 0
        for k in names:
            tensors[k] = flat[pos : pos + params[k].numel()].reshape(params[k].shape)
            pos += params[k].numel()
        logits = torch.func.functional_call(model, tensors, (x,))["logits"][:, :-1]
        return logits.reshape(-1, logits.shape[-1])[keep]

    def mean_loss(flat: torch.Tensor) -> torch.Tensor:
        labels = y[:, 1:].reshape(-1)[keep]
        return nn.functional.cross_entropy(scored_logits(flat), labels, reduction="sum") / len(x)

    theta = torch.cat([p.detach().reshape(-1) for p in params.values()])
    if kind == "hessian":
        dense = torch.autograd.functional.hessian(mean_loss, theta)
    elif kind == "empirical_fisher":
        grads, _, _ = per_example_gradients(model, x, y, output, next_token)
        g = torch.tensor(np.concatenate([grads[id(p)] for p in params.values()], axis=1))
        dense = g.T @ g / x.shape[0]
    else:  # G = 1/n sum over scored rows of J_r^T (diag(p_r) - p_r p_r^T) J_r
        jac = torch.func.jacrev(scored_logits)(theta)  # (m, C, P)
        p = scored_logits(theta).softmax(1)
        h = torch.diag_embed(p) - p.unsqueeze(2) * p.unsqueeze(1)
        dense = torch.einsum("mcp,mcd,mdq->pq", jac, h, jac) / x.shape[0]
    gen = torch.Generator().manual_seed(3)
    v = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in params.values()]
    got = ss.curvature.directional(
        model, x, y, v, kind=kind, output=output, next_token=next_token
    ).value
    flat = torch.cat([t.reshape(-1) for t in v])
    expected = float(flat @ dense @ flat / (flat @ flat))
    assert math.isclose(got, expected, rel_tol=1e-9)

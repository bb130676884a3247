"""Verification suite: HF Llama, T5, BART and position-embedding GPTs vs float64 brute force.

Tiny configs built here (no download). Every parameter of every model must be covered by the
probe (``record.uncovered_parameters == {}``) and agree with the per-example ``autograd.grad``
loop of tests/probe/oracle.py to 1e-10 relative (a block whose true gradient is exactly zero,
such as a key bias under softmax, to 1e-24 of the model's largest block). Opacus is the second
oracle where it is right (Llama without an attended pad token).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope.probe import DenseProbe
from tests.hf_models import tiny_model
from tests.probe.oracle import fisher_and_mean, per_example_gradients

RTOL = 1e-10
ZERO = 1e-24


class Seq2Seq(nn.Module):
    """T5 / BART as ``x -> logits`` with the decoder reading the same tokens."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=x, decoder_input_ids=x).logits


class CausalLM(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).logits


def build(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind.startswith("llama"):
        model: nn.Module = CausalLM(
            tiny_model(
                "llama",
                vocab=31,
                num_key_value_heads=1,  # grouped-query attention
                tie_word_embeddings=kind == "llama_tied",
                attention="eager",
            )
        )
    elif kind == "t5":
        t5 = tiny_model(
            "t5",
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            dropout_rate=0.0,
            attention="eager",
        )
        model = Seq2Seq(t5)
    elif kind == "bart":
        bart = tiny_model(
            "bart",
            layers=1,
            scale_embedding=True,  # BartScaledWordEmbedding's embed_scale
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            attention="eager",
        )
        model = Seq2Seq(bart)
    else:  # GPT-2: learned wpe, position ids (1, T)
        model = CausalLM(tiny_model("gpt2", layers=1, positions=8, attention="eager"))
    return model.double().eval()


def data(kind: str) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``n == T`` everywhere: the case a shape test cannot tell apart."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(2, 29, (4, 4), generator=gen)
    y = x.clone()
    causal = kind.startswith("llama") or kind == "gpt2"
    if causal:
        y[0, :2] = -100  # padding: not scored
    return x, y, causal


def assert_matches(record, truth: dict[str, torch.Tensor]) -> int:
    scale = max(fisher_and_mean(g)[0] for g in truth.values())
    checked = 0
    for key, grads in truth.items():
        layer, part = key.rsplit(".", 1)
        block = record.layers[layer] if part == "weight" else record.layers[layer].bias
        fisher, mean_sq = fisher_and_mean(grads)
        for got, want in ((block.fisher_trace, fisher), (block.mean_grad_sq_norm, mean_sq)):
            assert got is not None, (key, record.layers[layer].validity)
            assert abs(got - want) <= RTOL * want + ZERO * scale, (key, got, want)
        checked += 1
    return checked


@pytest.mark.parametrize("kind", ["llama", "llama_tied", "t5", "bart", "gpt2"])
def test_every_parameter_of_an_hf_model_matches_the_brute_force(kind):
    model = build(kind)
    x, y, causal = data(kind)
    record = DenseProbe(x, y, size=x.shape[0], next_token=causal).measure(
        model, step=0, examples_seen=0, epoch=0
    )
    truth = per_example_gradients(model, x, y, next_token=causal)
    assert record.uncovered_parameters == {}
    assert assert_matches(record, truth) == len(truth)
    kinds = {layer.kind for layer in record.layers.values()}
    if kind != "gpt2":  # LlamaRMSNorm / T5LayerNorm are LayerNorm-like; BART's are nn.LayerNorm
        assert kinds & {"elementwise_affine", "layernorm"}


def test_t5_shared_reports_the_total_of_its_tied_uses():
    model = build("t5")
    x, y, _ = data("t5")
    record = DenseProbe(x, y, size=4).measure(model, step=0, examples_seen=0, epoch=0)
    shared = record.layers["model.shared"]
    assert shared.fisher_trace == record.layers["model.encoder.embed_tokens"].fisher_trace
    assert shared.validity["calls"] in (0, None)


@pytest.mark.slow
def test_opacus_agrees_on_llama_where_it_is_right():
    """Second oracle: Opacus per-sample gradients (hooks + functorch) on the untied Llama."""
    opacus = pytest.importorskip("opacus")
    model = build("llama")
    x, y, _ = data("llama")
    y = x.clone()  # no padding (Opacus is right here)
    truth = per_example_gradients(model, x, y, next_token=True)
    record = DenseProbe(x, y, size=4, next_token=True).measure(
        model, step=0, examples_seen=0, epoch=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = opacus.GradSampleModule(
            model, batch_first=True, loss_reduction="sum", strict=False
        )
        wrapped.train()  # Opacus records activations in train mode only (no dropout here)
        logits = wrapped(x)
        loss = nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1), reduction="sum"
        )
        loss.backward()
    seen = 0
    for name, p in wrapped.named_parameters():
        key = name.removeprefix("_module.")
        assert torch.allclose(p.grad_sample, truth[key], rtol=1e-10, atol=1e-14)
        layer, part = key.rsplit(".", 1)
        block = record.layers[layer] if part == "weight" else record.layers[layer].bias
        fisher, _ = fisher_and_mean(p.grad_sample.detach())
        assert block.fisher_trace == pytest.approx(fisher, rel=1e-10, abs=0)
        seen += 1
    assert seen == len(truth)
    model.eval()


def test_analyze_curvature_on_a_tied_llama_reports_the_head_and_analyses_the_rest():
    model = build("llama_tied")
    x, y, _ = data("llama_tied")
    result = ss.curvature.analyze_curvature(model, x, y, next_token=True, include_directional=False)
    assert result["metadata"]["unsupported_layers"]["model.lm_head"]["reason"] == (
        "curvature_weight_shared"
    )
    assert "model.model.layers.0.self_attn.q_proj" in result["layers"]

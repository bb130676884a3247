"""Batch-free calls, float-indexed and scaled embeddings, tied owners.

Every number is checked against the float64 brute force of tests/probe/oracle.py: one
``autograd.grad`` per example, each example run alone (a batch of one), so a position table
broadcast over the batch gets its true per-example gradient whatever ``T`` and ``n`` are.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from stepscope.probe import DenseProbe
from tests.probe.oracle import fisher_and_mean, per_example_gradients

RTOL = 1e-10


class PositionTable(nn.Module):
    """The docs' ``pos(torch.arange(T))``: a ``(T, d)`` call broadcast over the batch."""

    def __init__(self, vocab: int = 11, d: int = 4, positions: int = 8) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(torch.tanh(self.mix(h)))


class RelativeBias(nn.Module):
    """T5-style ``relative_attention_bias`` on ``(T, T)`` buckets, permuted into the scores."""

    def __init__(self, vocab: int = 9, d: int = 4, heads: int = 2, buckets: int = 6) -> None:
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.bias = nn.Embedding(buckets, heads)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n, t = idx.shape
        h = self.tok(idx)
        q, k, v = (
            z.reshape(n, t, self.heads, -1).transpose(1, 2) for z in self.qkv(h).chunk(3, -1)
        )
        rel = torch.arange(t)[None, :] - torch.arange(t)[:, None]
        buckets = rel.clamp(-2, 3) + 2
        bias = self.bias(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, H, T, T)
        att = (q @ k.transpose(-1, -2) + bias).softmax(-1) @ v
        return self.head(att.transpose(1, 2).reshape(n, t, -1))


class FloatIndexedPositions(nn.Embedding):
    """BART's learned positions: takes floats (``inputs_embeds[:, :, -1]``), gathers arange + 2."""

    def __init__(self, positions: int, d: int) -> None:
        super().__init__(positions + 2, d)

    def forward(self, shape_only: torch.Tensor) -> torch.Tensor:
        n, t = shape_only.shape[:2]
        return super().forward(torch.arange(t).expand(n, -1) + 2)


class ScaledWords(nn.Embedding):
    """``BartScaledWordEmbedding``: the gather times ``embed_scale``."""

    def __init__(self, vocab: int, d: int, scale: float) -> None:
        super().__init__(vocab, d, padding_idx=1)
        self.embed_scale = scale

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx) * self.embed_scale


class BartLike(nn.Module):
    def __init__(self, vocab: int = 13, d: int = 4) -> None:
        super().__init__()
        self.embed_tokens = ScaledWords(vocab, d, scale=2.0)
        self.embed_positions = FloatIndexedPositions(8, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(idx)
        h = h + self.embed_positions(h[:, :, -1])  # floats, needed for the shape only
        return self.head(torch.tanh(h))


class Indexing(nn.Embedding):
    """An embedding subclass that never calls ``F.embedding``: no gather to record."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.weight[idx]


class TiedEncoder(nn.Module):
    """T5's layout: ``shared`` owns the weight and never runs; ``embed_tokens`` uses it."""

    def __init__(self, vocab: int = 10, d: int = 4) -> None:
        super().__init__()
        self.shared = nn.Embedding(vocab, d)
        self.embed_tokens = nn.Embedding(vocab, d)
        self.embed_tokens.weight = self.shared.weight
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embed_tokens(idx)))


def check_against_brute_force(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    record = DenseProbe(x, y, size=x.shape[0]).measure(model, step=0, examples_seen=0, epoch=0)
    truth = per_example_gradients(model, x, y)
    names = dict(model.named_modules())
    checked = 0
    for key, grads in truth.items():
        layer, part = key.rsplit(".", 1)
        if layer not in record.layers:
            continue  # a tied alias (named_parameters lists the owner only)
        block = record.layers[layer] if part == "weight" else record.layers[layer].bias
        fisher, mean_sq = fisher_and_mean(grads)
        assert block.fisher_trace == pytest.approx(fisher, rel=RTOL, abs=0), key
        assert block.mean_grad_sq_norm == pytest.approx(mean_sq, rel=RTOL, abs=0), key
        checked += 1
    assert checked and all(n in names for n in record.layers)
    return record.layers


@pytest.mark.parametrize("n", [5, 3])  # T = 5: n == T (the silent case) and n != T
def test_a_position_table_broadcast_over_the_batch_gets_its_per_example_gradient(n):
    torch.manual_seed(0)
    model = PositionTable().double()
    x = torch.randint(0, 11, (n, 5))
    layers = check_against_brute_force(model, x, x)
    assert layers["pos"].fisher_trace is not None


@pytest.mark.parametrize("n", [4, 3])  # T = 4
def test_a_relative_attention_bias_on_t_by_t_buckets_is_exact(n):
    torch.manual_seed(1)
    model = RelativeBias().double()
    x = torch.randint(0, 9, (n, 4))
    check_against_brute_force(model, x, x)


def test_float_indexed_and_scaled_embeddings_are_exact():
    torch.manual_seed(2)
    model = BartLike().double()
    x = torch.randint(0, 13, (4, 6))
    x[0, 2] = 1  # a padding token: no gradient for row 1
    layers = check_against_brute_force(model, x, x)
    assert layers["embed_tokens"].kind == "embedding"


def test_an_embedding_that_never_gathers_is_absent_with_its_reason():
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = Indexing(7, 3)
            self.head = nn.Linear(3, 7)

        def forward(self, idx):
            return self.head(self.emb(idx))

    x = torch.randint(0, 7, (4, 3))
    record = DenseProbe(x, x, size=4).measure(Model(), step=0, examples_seen=0, epoch=0)
    emb = record.layers["emb"]
    assert emb.fisher_trace is None
    assert emb.validity["gradient_absent_reason"] == "no_embedding_gather"
    assert record.layers["head"].fisher_trace is not None


def test_a_tied_owner_that_never_runs_reports_the_total():
    torch.manual_seed(3)
    model = TiedEncoder().double()
    x = torch.randint(0, 10, (4, 3))
    layers = check_against_brute_force(model, x, x)  # shared.weight is the brute force's name
    assert layers["shared"].fisher_trace == layers["embed_tokens"].fisher_trace


def test_the_probe_never_uses_f_embedding_outside_the_gather(monkeypatch):
    """The gather capture is scoped to the embedding's own forward (no global mode left on)."""
    model = PositionTable().double()
    x = torch.randint(0, 11, (3, 5))
    DenseProbe(x, x, size=3).measure(model, step=0, examples_seen=0, epoch=0)
    assert not torch.overrides._get_current_function_mode_stack()
    assert F.embedding(torch.tensor([0]), torch.ones(2, 2)).shape == (1, 2)


def test_a_gather_called_with_keywords_is_recorded():
    class KeywordGather(nn.Embedding):
        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return F.embedding(input=idx, weight=self.weight) * 3.0

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = KeywordGather(7, 3)
            self.head = nn.Linear(3, 7)

        def forward(self, idx):
            return self.head(torch.tanh(self.emb(idx)))

    torch.manual_seed(7)
    x = torch.randint(0, 7, (4, 3))
    check_against_brute_force(Model().double(), x, x)

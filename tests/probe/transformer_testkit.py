"""Transformer-shaped test models and a float64 ``torch.func`` per-example-gradient oracle.

Shared by the probe and curvature tests (``tests/curvature/conftest.py`` puts this folder on the
path). Models are built from code or tiny configs, never downloaded:

- :class:`TinyGPT`: token + position embeddings, pre-LayerNorm blocks whose attention input
  projection is an HF-style ``Conv1D`` (transposed Linear, ``weight (d_in, d_out)``) and output
  projection an ``nn.Linear``, an MLP, a final LayerNorm and a head tied to the token embedding;
  returns ``{"logits": (n, T, V)}``.
- :class:`TinyBert`: embeddings + LayerNorm, a Conv1d token mixer, one encoder block applied
  twice (ALBERT-style sharing: every module runs twice), RMSNorm, pooler and classifier;
  returns ``{"logits": (n, C)}``.
- :class:`TinyViT`: Conv2d patch embedding, class token, a block with a fused ``qkv`` Linear on
  ``(n, T, d)`` input, LayerNorm and a head; returns the ``(n, C)`` tensor.

The oracle differentiates each example alone (a batch of one) with ``torch.func.grad`` of that
example's loss (summed over its scored positions) with respect to a float64 copy's parameters;
tied parameters appear once (``functional_call`` ties them), so their gradient is the total.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

from tests.hf_models import tiny_model


class Conv1D(nn.Module):
    """HF ``transformers.pytorch_utils.Conv1D``: ``y = x @ W + b`` with ``W (nx, nf)``."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.reshape(*x.shape[:-1], self.nf)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, causal: bool):
    n, t, d = q.shape
    q, k, v = (z.reshape(n, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // heads)
    if causal:
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, d)


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(3 * d, d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(2 * d, d)
        self.mlp_proj = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, dim=-1)
        x = x + self.attn_proj(_attend(q, k, v, self.heads, causal=True))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(
        self, vocab: int = 23, d: int = 8, positions: int = 7, heads: int = 2, tied: bool = True
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(positions, d)
        self.block = GPTBlock(d, heads)
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight  # tied head

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        pos = torch.arange(idx.shape[1], device=idx.device).unsqueeze(0)  # (1, T) as in HF
        x = self.wte(idx) + self.wpe(pos)
        return {"logits": self.lm_head(self.ln_f(self.block(x)))}


class BertBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_norm = nn.LayerNorm(d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.out_norm = nn.RMSNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        att = _attend(self.query(x), self.key(x), self.value(x), self.heads, causal=False)
        x = self.attn_norm(x + att)
        return self.out_norm(x + self.down(torch.tanh(self.up(x))))


class TinyBert(nn.Module):
    def __init__(
        self, vocab: int = 19, d: int = 8, positions: int = 9, classes: int = 3, shared: bool = True
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, d, padding_idx=0)
        self.position = nn.Embedding(positions, d)
        self.emb_norm = nn.LayerNorm(d)
        self.mixer = nn.Conv1d(d, d, 3, padding=1)
        self.block = BertBlock(d, heads=2)
        self.block2 = self.block if shared else BertBlock(d, heads=2)
        self.pooler = nn.Linear(d, d)
        self.classifier = nn.Linear(d, classes)

    def forward(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        pos = torch.arange(idx.shape[1], device=idx.device).expand(idx.shape[0], -1)
        x = self.emb_norm(self.word(idx) + self.position(pos))
        x = x + self.mixer(x.transpose(1, 2)).transpose(1, 2)
        x = self.block2(self.block(x))  # shared (default): ALBERT-style, one block, two calls
        return {"logits": self.classifier(torch.tanh(self.pooler(x[:, 0])))}


class TinyViT(nn.Module):
    def __init__(self, d: int = 8, classes: int = 4, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.patch = nn.Conv2d(3, d, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.1)
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.head_norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.patch(img).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        x = x + self.proj(_attend(q, k, v, self.heads, causal=False))
        return self.head(self.head_norm(x[:, 0]))


def make_transformer(kind: str, seed: int = 0) -> nn.Module:
    """A float64 tiny model of ``kind`` (``gpt``, ``bert``, ``vit``, ``hf_gpt2``, ``hf_bert``)."""
    torch.manual_seed(seed)
    if kind == "gpt":
        model = TinyGPT()
    elif kind == "gpt_untied":
        model = TinyGPT(tied=False)
    elif kind == "bert":
        model = TinyBert()
    elif kind == "bert_unshared":
        model = TinyBert(shared=False)
    elif kind == "vit":
        model = TinyViT()
    elif kind in ("hf_gpt2", "hf_gpt2_untied"):
        tied = kind == "hf_gpt2"
        model = tiny_model("gpt2", positions=8, tie_word_embeddings=tied, attention="eager")
    elif kind == "hf_bert":
        model = tiny_model("bert", vocab=31, positions=12, num_labels=3, attention="eager")
    else:
        raise ValueError(kind)
    return model.double().eval()


#: per kind: (labels kind, output selector, next_token)
TARGETS: dict[str, tuple[str, Any, bool]] = {
    "gpt": ("tokens", "logits", True),
    "gpt_untied": ("tokens", "logits", True),
    "bert_unshared": ("classes", "logits", False),
    "bert": ("classes", "logits", False),
    "vit": ("classes", None, False),
    "hf_gpt2": ("tokens", "logits", True),
    "hf_gpt2_untied": ("tokens", "logits", True),
    "hf_bert": ("classes", lambda out: out.logits, False),
}


def make_transformer_data(kind: str, n: int = 10, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """Probe inputs and labels (token labels carry some ``-100`` ignored positions)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "vit":
        return torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64), torch.randint(
            0, 4, (n,), generator=g
        )
    vocab, t = {"gpt": (23, 7), "bert": (19, 9), "hf_gpt2": (29, 8), "hf_bert": (31, 12)}[
        kind.rsplit("_", 1)[0] if kind.endswith(("_untied", "_unshared")) else kind
    ]
    x = torch.randint(0, vocab, (n, t), generator=g)
    if TARGETS[kind][0] == "tokens":
        y = x.clone()
        y[torch.rand(n, t, generator=g) < 0.2] = -100
        return x, y
    x[:, -2:] = torch.where(torch.rand(n, 2, generator=g) < 0.5, 0, x[:, -2:])  # some padding
    return x, torch.randint(0, 3, (n,), generator=g)


def example_loss(logits: torch.Tensor, y: torch.Tensor, next_token: bool) -> torch.Tensor:
    """One example's loss: CE summed over its scored targets (independent of the probe's code)."""
    if y.dim() == 1:
        return F.cross_entropy(logits, y, reduction="sum")
    if next_token:
        logits, y = logits[:, :-1], y[:, 1:]
    keep = y != -100
    ce = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), y.clamp(min=0).reshape(-1), reduction="none"
    )
    return (ce * keep.reshape(-1)).sum()


def _select(out: Any, output: Any) -> torch.Tensor:
    if output is None:
        return out
    return output(out) if callable(output) else out[output]


def per_example_gradients(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, output: Any, next_token: bool
) -> tuple[dict[str, np.ndarray], list[float], int]:
    """``id(parameter of model) -> (n, numel)`` per-example gradients, per-example losses, targets."""
    m64 = copy.deepcopy(model).double().eval()
    names = {id(p): k for k, p in m64.named_parameters()}
    originals = dict(zip((id(p) for p in model.parameters()), m64.parameters()))
    params = {k: p.detach() for k, p in m64.named_parameters()}

    def loss(params: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor):
        out = _select(functional_call(m64, params, (xi,)), output)
        return example_loss(out, yi, next_token)

    rows: dict[str, list[np.ndarray]] = {k: [] for k in params}
    losses = []
    xs = x.double() if x.is_floating_point() else x
    for i in range(x.shape[0]):
        g = grad(loss)(params, xs[i : i + 1], y[i : i + 1])
        for k, v in g.items():
            rows[k].append(v.reshape(-1).numpy())
        losses.append(float(loss(params, xs[i : i + 1], y[i : i + 1])))
    per_param = {k: np.stack(v) for k, v in rows.items()}
    out = {pid: per_param[names[id(p64)]] for pid, p64 in originals.items()}
    targets = int(((y[:, 1:] if next_token else y) != -100).sum()) if y.dim() == 2 else len(y)
    return out, losses, targets


def moments(g: np.ndarray) -> dict[str, float]:
    """Every probe moment of explicit per-example gradients ``g`` (n, P)."""
    sq = (g**2).sum(1)
    mean = g.mean(0)
    norms = np.sqrt(sq)
    return {
        "fisher_trace": sq.mean(),
        "mean_grad_sq_norm": (mean**2).sum(),
        "covariance_trace": ((g - mean) ** 2).sum(1).mean(),
        "gradient_diversity": sq.sum() / (g.sum(0) ** 2).sum(),
        "grad_norm_rms": np.sqrt(sq.mean()),
        "grad_fro_legacy_scale": np.sqrt((mean**2).sum()),
        **{
            f"q_{q}": np.quantile(norms, v)
            for q, v in (("min", 0), ("q25", 0.25), ("median", 0.5), ("q75", 0.75), ("max", 1))
        },
    }


def curvature_oracle(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    output: Any,
    next_token: bool,
    names: list[str],
) -> dict[str, Any]:
    """Brute-force float64 curvature blocks, one example and one logit at a time.

    For each example alone and each scored logit ``(t, c)``, ``autograd.grad`` gives the rows of
    the Jacobians with respect to each layer's output ``z`` (``Jz``) and its parameters
    (``Jtheta``). With ``H_t = diag(p_t) - p_t p_t^T`` and ``g_t = p_t - e_{y_t}``:

    - exact diagonals: EF ``mean_i (sum_t g_t Jtheta_t)^2``, GGN ``mean_i sum_t diag(Jtheta_t^T
      H_t Jtheta_t)``, Jacobian Gram ``mean_i sum_t diag(Jtheta_t^T Jtheta_t)``;
    - KFAC factors by definition: ``A_expand = mean_{i,p} a a^T``, ``A_reduce = mean_i abar abar^T``
      (``abar`` = mean over positions), ``B_expand = 1/n sum_i sum_p Jz_p^T Q Jz_p`` and
      ``B_reduce = 1/n sum_i Jzs^T Q Jzs`` (``Jzs`` = sum over positions) with ``Q = H_t``, ``I``
      or ``g g^T`` summed over scored positions.
    """
    m64 = copy.deepcopy(model).double().eval()
    modules = dict(m64.named_modules())
    n = x.shape[0]
    out: dict[str, Any] = {}
    xs = x.double() if x.is_floating_point() else x
    fams = ("empirical_fisher", "ce_ggn", "jacobian_gram")
    for i in range(n):
        seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        handles = [
            modules[k].register_forward_hook(
                lambda m, a, o, k=k, seen=seen: seen.__setitem__(k, (a[0].detach(), o))
            )
            for k in names
        ]
        try:
            logits = _select(m64(xs[i : i + 1]), output)
        finally:
            for h in handles:
                h.remove()
        yi = y[i : i + 1]
        if yi.dim() == 1:
            rows = [(logits[0], int(yi[0]))]
        else:
            lg, lab = (logits[0, :-1], yi[0, 1:]) if next_token else (logits[0], yi[0])
            rows = [(lg[t], int(lab[t])) for t in range(lab.shape[0]) if lab[t] != -100]
        for k in names:
            mod = modules[k]
            params = [mod.weight] + ([mod.bias] if mod.bias is not None else [])
            a, z = seen[k]
            a = a.reshape(-1, a.shape[-1])
            entry = out.setdefault(k, {"A_expand": 0.0, "A_reduce": 0.0, **{f: {} for f in fams}})
            entry["A_expand"] = entry["A_expand"] + a.T @ a / (n * a.shape[0])
            am = a.mean(0)
            entry["A_reduce"] = entry["A_reduce"] + torch.outer(am, am) / n
            g_theta = [torch.zeros_like(p) for p in params]
            g_z = torch.zeros_like(z).reshape(-1, z.shape[-1])
            for row, label in rows:
                c = row.shape[0]
                jz, jt = [], [[] for _ in params]
                for j in range(c):
                    gr = torch.autograd.grad(row[j], [z, *params], retain_graph=True)
                    jz.append(gr[0].reshape(-1, z.shape[-1]))
                    for q, gp in enumerate(gr[1:]):
                        jt[q].append(gp.reshape(-1))
                jz_t = torch.stack(jz)  # (C, P, o)
                jt_t = [torch.stack(v) for v in jt]  # (C, numel)
                p = row.detach().softmax(0)
                h = torch.diag(p) - torch.outer(p, p)
                g = p.clone()
                g[label] -= 1.0
                g_z = g_z + torch.einsum("c,cpo->po", g, jz_t)
                for q in range(len(params)):
                    g_theta[q] = g_theta[q] + (g @ jt_t[q]).reshape(params[q].shape)
                for fam, qmat in (("ce_ggn", h), ("jacobian_gram", torch.eye(c, dtype=h.dtype))):
                    e = entry[fam]
                    for q, part in enumerate(("weight", "bias")[: len(params)]):
                        d = ((qmat @ jt_t[q]) * jt_t[q]).sum(0).reshape(params[q].shape) / n
                        e[part] = e.get(part, 0.0) + d
                    be = torch.einsum("cpo,cd,dpr->or", jz_t, qmat, jz_t) / n
                    js = jz_t.sum(1)
                    e["B_expand"] = e.get("B_expand", 0.0) + be
                    e["B_reduce"] = e.get("B_reduce", 0.0) + js.T @ qmat @ js / n
            e = entry["empirical_fisher"]
            for q, part in enumerate(("weight", "bias")[: len(params)]):
                e[part] = e.get(part, 0.0) + g_theta[q].square() / n
            gs = g_z.sum(0)
            e["B_expand"] = e.get("B_expand", 0.0) + g_z.T @ g_z / n
            e["B_reduce"] = e.get("B_reduce", 0.0) + torch.outer(gs, gs) / n
    return out

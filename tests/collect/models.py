"""Real-model test kit: small models built from code (no downloads) and an independent oracle.

Every :class:`Case` builds a model that exercises one thing real training stacks do (residual
CNNs with in-place ReLU and BatchNorm, a GPT-style decoder with a tied head and variable sequence
length, an LSTM, dict and ``ModelOutput``-like outputs, weight sharing, activation checkpointing,
sparse embeddings, complex activations). :func:`train` runs a few optimizer steps of a case with or
without a collector; :class:`HookOracle` records, with its *own* forward hooks, tensor hooks and
gradient / parameter snapshots, the numbers every recorded row must equal (numel, sum, sum of
squares, min, max), over training forwards only.

Other test packages and the benchmarks import it as a package module (the repository root is on
``sys.path``: pytest's ``pythonpath``, or ``python -m benchmarks.<name>`` from the root)::

    from tests.collect.models import CASES, HookOracle, train
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# ------------------------------------------------------------------------------------- models


class BasicBlock(nn.Module):
    """torchvision's ResNet block: the same in-place ReLU module is called twice per forward."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNetish(nn.Module):
    """Conv stem, BatchNorm, two residual blocks (one with a 1x1 downsample), pool, classifier."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = BasicBlock(8, 8)
        self.layer2 = BasicBlock(8, 16, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.attn_dropout = nn.Dropout(0.1)  # unused on the SDPA path: never runs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int, torch_mha: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.torch_mha = torch_mha
        self.attn = (
            nn.MultiheadAttention(d, heads, batch_first=True)  # returns (out, None)
            if torch_mha
            else CausalSelfAttention(d, heads)
        )
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        if self.torch_mha:
            t = x.shape[1]
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        else:
            a = self.attn(h)
        x = x + self.drop(a)
        return x + self.drop(self.mlp(self.ln_2(x)))


class TinyGPT(nn.Module):
    """nanoGPT-style decoder: token + position embeddings, tied head, variable sequence length."""

    def __init__(self, vocab: int = 40, d: int = 32, heads: int = 4, ctx: int = 32) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList([GPTBlock(d, heads, False), GPTBlock(d, heads, True)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class LSTMTagger(nn.Module):
    """Embedding -> 2-layer LSTM (returns ``(out, (h, c))``) -> per-token classifier."""

    def __init__(self, vocab: int = 30, d: int = 16, tags: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, d, num_layers=2, batch_first=True)
        self.out = nn.Linear(d, tags)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(idx))
        return self.out(h)


class DictHeads(nn.Module):
    def __init__(self, d: int, classes: int) -> None:
        super().__init__()
        self.cls = nn.Linear(d, classes)
        self.aux = nn.Linear(d, 1)

    def forward(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": self.cls(h), "aux": self.aux(h)}


class DictNet(nn.Module):
    """A submodule and the model itself return dicts; an unused ModuleList never runs."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 12), nn.Tanh())
        self.heads = DictHeads(12, classes)
        self.spare = nn.ModuleList([nn.Linear(12, 12)])  # registered, never called

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.heads(self.body(x))
        return {"logits": out["logits"], "aux": out["aux"].squeeze(-1)}


@dataclass
class TinyOutput:
    """Stands in for ``transformers.utils.ModelOutput`` (a dataclass; ``None`` fields skipped)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class OrderedOutput(OrderedDict):
    """Like ``ModelOutput``: a mapping whose values are the non-``None`` fields, in order."""


class OutputNet(nn.Module):
    """Returns a ``ModelOutput``-like dataclass; an encoder returns an ``OrderedDict`` subclass."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.classifier = nn.Linear(10, classes)

    def forward(self, x: torch.Tensor) -> TinyOutput:
        enc = self.encoder(x)
        h = enc["last_hidden_state"]
        return TinyOutput(logits=self.classifier(h), hidden_states=(h,))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(5, 10)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> OrderedOutput:
        return OrderedOutput(last_hidden_state=self.act(self.proj(x)))


class SharedNet(nn.Module):
    """Weight sharing: one Linear applied twice per forward, and two modules with one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.shared = nn.Linear(8, 8)  # called twice
        self.act = nn.ReLU()
        self.enc = nn.Linear(8, 8, bias=False)
        self.dec = nn.Linear(8, 8, bias=False)
        self.dec.weight = self.enc.weight  # one parameter, two owners
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.shared(self.act(self.shared(self.inp(x)))))
        return self.head(self.dec(self.enc(h)))


class CheckpointNet(nn.Module):
    """Blocks under ``torch.utils.checkpoint``: non-reentrant and reentrant recomputation."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.block1 = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.LayerNorm(16))
        self.block2 = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = checkpoint(self.block1, h, use_reentrant=False)
        h = checkpoint(self.block2, h, use_reentrant=True)
        return self.head(h)


class SparseEmbNet(nn.Module):
    """``nn.Embedding(sparse=True)``: its gradient is a sparse COO tensor."""

    def __init__(self, vocab: int = 50, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d, sparse=True)
        self.fc = nn.Linear(d, 2)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(idx).mean(1))


class ToComplex(nn.Module):
    """Pairs features into complex numbers (a complex activation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.complex(x[..., 0::2], x[..., 1::2])


class ComplexMod(nn.Module):
    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(z * z).flatten(-2)


class ComplexNet(nn.Module):
    """Real -> complex -> real: two sites whose activation (or its gradient) is complex."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.to_complex = ToComplex()
        self.square = ComplexMod()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.square(self.to_complex(self.inp(x))))


# -------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One real-model scenario: how to build, feed and optimise it."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator, int], tuple[Any, Any]]
    loss: Callable[[Any, Any], torch.Tensor]
    optimizer: Callable[[nn.Module], torch.optim.Optimizer] = field(
        default=lambda m: torch.optim.Adam(m.parameters(), lr=1e-2)
    )
    variable_length: bool = False
    micro_batches: int = 1
    #: sites whose activation cannot be reduced: (site, stream) -> unsupported reason prefix
    unsupported: dict[tuple[str, str], str] = field(default_factory=dict)
    #: sites that never run
    never_run: tuple[str, ...] = ()


LENGTHS = (5, 9, 7, 12, 6, 10, 8, 11)


def _image(g: torch.Generator, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)


def _tokens(vocab: int, tags: int | None = None):
    def make(g: torch.Generator, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = LENGTHS[step % len(LENGTHS)]
        idx = torch.randint(0, vocab, (3, t), generator=g)
        target = torch.randint(0, tags or vocab, (3, t), generator=g)
        return idx, target

    return make


def _vector(width: int, classes: int):
    def make(g: torch.Generator, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(6, width, generator=g), torch.randint(0, classes, (6,), generator=g)

    return make


def _ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


CASES: dict[str, Case] = {
    c.name: c
    for c in [
        Case("resnet", ResNetish, _image, _ce, micro_batches=2),
        Case(
            "gpt",
            TinyGPT,
            _tokens(40),
            _ce,
            variable_length=True,
            never_run=("h.0.attn.attn_dropout",),
        ),
        Case("lstm", LSTMTagger, _tokens(30, 4), _ce, variable_length=True),
        Case(
            "dict",
            DictNet,
            _vector(6, 3),
            lambda o, y: F.cross_entropy(o["logits"], y) + o["aux"].pow(2).mean(),
            never_run=("spare", "spare.0"),
        ),
        Case("model_output", OutputNet, _vector(5, 3), lambda o, y: F.cross_entropy(o.logits, y)),
        Case("shared", SharedNet, _vector(4, 2), _ce, micro_batches=2),
        Case("checkpoint", CheckpointNet, _vector(6, 3), _ce),
        Case(
            "sparse",
            SparseEmbNet,
            lambda g, s: (torch.randint(0, 50, (4, 3), generator=g), torch.randint(0, 2, (4,))),
            _ce,
            optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
        ),
        Case(
            "complex",
            ComplexNet,
            _vector(6, 2),
            _ce,
            unsupported={
                ("to_complex", "activation"): "complex",
                ("to_complex", "activation_grad"): "complex",
            },
        ),
    ]
}


# ------------------------------------------------------------------------------------- oracle


def first_tensor(value: Any, depth: int = 0) -> torch.Tensor | None:
    """The oracle's own reading of the documented rule: the first tensor, depth first."""
    if isinstance(value, torch.Tensor):
        return value
    if depth > 4:
        return None
    if isinstance(value, dict):
        children: Any = list(value.values())
    elif is_dataclass(value) and not isinstance(value, type):
        children = [getattr(value, f.name) for f in fields(value)]
    elif isinstance(value, (tuple, list)):
        children = list(value)
    else:
        return None
    for child in children:
        found = first_tensor(child, depth + 1)
        if found is not None:
            return found
    return None


@dataclass
class Numbers:
    """numel, sum, sum of squares, min, max of everything one row saw in one step."""

    numel: int
    sum: float
    sum_squares: float
    min: float
    max: float
    sum_abs: float

    @classmethod
    def of(cls, tensors: list[torch.Tensor]) -> Numbers:
        flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])
        return cls(
            flat.numel(),
            float(flat.sum()),
            float((flat * flat).sum()),
            float(flat.min()),
            float(flat.max()),
            float(flat.abs().sum()),
        )


def _values(t: torch.Tensor) -> torch.Tensor:
    return t.coalesce().values() if t.layout == torch.sparse_coo else t


class HookOracle:
    """Independent capture of what every row of a collector should hold, per step.

    Parameters
    ----------
    model
        The model (the oracle registers its own hooks; :meth:`remove` takes them off).
    sites
        Qualified module names to watch (``""`` is the model itself).

    Use ``with oracle.forward(): out = model(x)`` around *training* forwards only, and call
    :meth:`before_step` right before ``optimizer.step()`` and :meth:`after_step` right after.
    """

    def __init__(self, model: nn.Module, sites: list[str]) -> None:
        self.model = model
        self.step = 0
        self.active = False
        self.data: dict[tuple[str, str, int], list[torch.Tensor]] = {}
        self._handles = []
        modules = dict(model.named_modules())
        seen: set[int] = set()
        self.params: list[tuple[str, torch.nn.Parameter]] = []
        for name in sites:
            module = modules[name]
            self._handles.append(module.register_forward_hook(self._hook(name or "<root>")))
            for pname, p in module.named_parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    self.params.append((f"{name}.{pname}" if name else pname, p))
        self._before: dict[str, torch.Tensor] = {}

    def _add(self, site: str, stream: str, t: torch.Tensor) -> None:
        if t.is_complex():
            return  # no ordered statistics: the collector must record ``unsupported``
        self.data.setdefault((site, stream, self.step), []).append(_values(t).detach().clone())

    def _hook(self, site: str):
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not self.active:
                return
            t = first_tensor(output)
            if t is None:
                return
            self._add(site, "activation", t)
            if t.requires_grad:
                t.register_hook(lambda g: self._add(site, "activation_grad", g))

        return hook

    class _Forward:
        def __init__(self, oracle: HookOracle) -> None:
            self.oracle = oracle

        def __enter__(self) -> None:
            self.oracle.active = True

        def __exit__(self, *exc: object) -> None:
            self.oracle.active = False

    def forward(self) -> HookOracle._Forward:
        """Mark a training forward (the only forwards whose activations count)."""
        return HookOracle._Forward(self)

    def before_step(self) -> None:
        for site, p in self.params:
            if p.grad is not None:
                self._add(site, "gradient", p.grad)
            self._before[site] = p.detach().clone()

    def after_step(self) -> None:
        for site, p in self.params:
            self._add(site, "parameter", p)
            before = self._before.pop(site)
            if p.grad is not None:  # torch optimizers skip a parameter without a gradient
                self._add(site, "update", p.detach() - before)
        self.step += 1

    def numbers(self, site: str, stream: str, step: int) -> Numbers | None:
        ts = self.data.get((site, stream, step))
        return None if not ts else Numbers.of(ts)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


# -------------------------------------------------------------------------------------- loops


def evaluate(model: nn.Module, x: Any) -> None:
    """Forwards that are not training: no_grad in train mode, inference_mode, eval mode."""
    with torch.no_grad():
        model(x)
    with torch.inference_mode():
        model(x)
    was = model.training
    model.eval()
    with torch.no_grad():
        model(x)
    model.train(was)


def train(
    case: Case,
    collector_factory: Callable[[nn.Module, torch.optim.Optimizer], Any] | None = None,
    steps: int = 6,
    oracle_sites: list[str] | None = None,
    evaluations: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Run ``steps`` explicit steps of ``case``; returns losses, final state, collector, oracle.

    With ``evaluations`` every step also runs the three non-training forwards of
    :func:`evaluate` inside the transaction (they must not reach the step's rows).
    """
    torch.manual_seed(seed)
    model = case.build()
    opt = case.optimizer(model)
    collector = None if collector_factory is None else collector_factory(model, opt)
    oracle = None if oracle_sites is None else HookOracle(model, oracle_sites)
    g = torch.Generator().manual_seed(seed + 1)
    losses = []
    for step in range(steps):
        ctx = collector.step(opt) if collector is not None else _null()
        with ctx:
            opt.zero_grad()
            for _ in range(case.micro_batches):
                x, y = case.batch(g, step)
                with oracle.forward() if oracle is not None else _null():
                    out = model(x)
                loss = case.loss(out, y) / case.micro_batches
                loss.backward()
                losses.append(loss.detach().clone())
            if evaluations:
                evaluate(model, x)
            if oracle is not None:
                oracle.before_step()
            opt.step()
            if oracle is not None:
                oracle.after_step()
    if collector is not None:
        collector.close()
    if oracle is not None:
        oracle.remove()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {
        "losses": torch.stack(losses),
        "state": state,
        "collector": collector,
        "oracle": oracle,
        "model": model,
    }


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def spine_numbers(spine: np.ndarray) -> Numbers:
    """The same five numbers read from a recorded spine row (fields of ``SPINE_FIELDS``)."""
    from stepscope.stats import SPINE_FIELDS

    get = {name: float(spine[i]) for i, name in enumerate(SPINE_FIELDS)}
    return Numbers(
        int(get["total"]), get["sum"], get["sum_squares"], get["min"], get["max"], get["sum_abs"]
    )


def close(a: Numbers, b: Numbers) -> bool:
    """Equal up to float64 summation order (relative to the sum of magnitudes)."""
    scale = max(a.sum_abs, 1.0)
    return (
        a.numel == b.numel
        and math.isclose(a.sum, b.sum, rel_tol=1e-9, abs_tol=1e-9 * scale)
        and math.isclose(a.sum_squares, b.sum_squares, rel_tol=1e-9, abs_tol=1e-12)
        and a.min == b.min
        and a.max == b.max
    )

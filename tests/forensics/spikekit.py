"""Training the GPT-like test model with the flight recorder, and an independent every-step reading.

:func:`train` runs ``TinyGPT`` (AdamW, the injected layer in its own parameter group) for a number
of steps and, optionally, multiplies that layer's learning rate by ``factor`` for the one step
``inject_at`` (or scales the logits of the batch ``corrupt_at`` by 30, a corrupted batch). The
test's own hooks (torch's optimizer step hooks and forward hooks, float64)
read the same quantities as the recorder at every step, from the tensors themselves:
``Independent.values[(site, field)][step]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

import stepscope as ss
from tests.collect.models import TinyGPT

VOCAB = 40
INJECTED = "h.0.mlp.0"  # the first MLP linear of the first block
#: called with the step after each step (the crash test's child waits there to be killed)
AFTER_STEP: Any = None


@dataclass
class Independent:
    """Every-step float64 readings by the test's own hooks: ``values[(site, field)][step]``."""

    values: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)
    step: int = 0

    def put(self, site: str, name: str, v: float) -> None:
        self.values.setdefault((site, name), {})[self.step] = v


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((t for t in out if isinstance(t, torch.Tensor)), None)
    return None


def independent_hooks(
    model: torch.nn.Module, opt: torch.optim.Optimizer, rec: Independent
) -> tuple[Independent, list]:
    """Register the test's own float64 readers of gradients, updates, parameters, activations."""
    names = {id(p): n for n, p in model.named_parameters()}  # tied weight: its first name
    before: dict[int, torch.Tensor] = {}

    def pre(optimizer: Any, *_: Any) -> None:
        for g in optimizer.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    gd = p.grad.double()
                    rec.put(names[id(p)], "grad_rms", math.sqrt(float(gd.pow(2).mean())))
                before[id(p)] = p.detach().double().clone()

    def post(optimizer: Any, *_: Any) -> None:
        for g in optimizer.param_groups:
            for p in g["params"]:
                b, a = before.pop(id(p)), p.detach().double()
                d = a - b
                rec.put(names[id(p)], "update_rms", math.sqrt(float(d.pow(2).mean())))
                if float(b.norm()) > 0:
                    rec.put(names[id(p)], "update_ratio", float(d.norm() / b.norm()))
                rec.put(names[id(p)], "param_rms", math.sqrt(float(a.pow(2).mean())))

    handles = [opt.register_step_pre_hook(pre), opt.register_step_post_hook(post)]
    for name, m in model.named_modules():
        if next(m.children(), None) is not None or not name:
            continue

        def fwd(_m: Any, _i: Any, out: Any, name: str = name) -> None:
            t = _first_tensor(out)
            if t is not None and t.is_floating_point():
                rec.put(name, "act_absmax", float(t.detach().double().abs().max()))

        handles.append(m.register_forward_hook(fwd))
    return rec, handles


@dataclass
class Trained:
    collector: Any
    independent: Independent
    losses: list[float]


def train(
    steps: int,
    settings: ss.WatchSettings,
    inject_at: int | None = None,
    factor: float = 100.0,
    seed: int = 0,
    batch: int = 8,
    streams: Sequence[str] = ("activation", "gradient", "parameter", "update"),
    corrupt_at: int | None = None,
) -> Trained:
    """Train ``TinyGPT`` with ``settings`` (a flight recorder in them) and the test's own hooks."""
    torch.manual_seed(seed)
    model = TinyGPT(vocab=VOCAB)
    injected = dict(model.named_modules())[INJECTED]
    own = {id(p) for p in injected.parameters()}
    rest = [p for p in model.parameters() if id(p) not in own]
    lr = 1e-3
    opt = torch.optim.AdamW([{"params": rest}, {"params": list(injected.parameters())}], lr=lr)
    rec, handles = independent_hooks(model, opt, Independent())
    data = torch.Generator().manual_seed(seed + 1)
    losses = []
    try:
        with ss.HistoryCollector(model, streams=list(streams), settings=settings) as c:
            for step in range(steps):
                rec.step = step
                x = torch.randint(0, VOCAB, (batch, 16), generator=data)
                with c.step(opt, examples=batch):
                    logits = model(x)
                    if step == corrupt_at:  # a corrupted batch: its logits 30x too confident
                        logits = logits * 30.0
                    loss = torch.nn.functional.cross_entropy(
                        logits.reshape(-1, VOCAB), x.roll(-1, 1).reshape(-1)
                    )
                    opt.zero_grad()
                    loss.backward()
                    opt.param_groups[1]["lr"] = lr * factor if step == inject_at else lr
                    opt.step()
                    c.log("loss", loss.detach())
                losses.append(float(loss.detach()))
                if AFTER_STEP is not None:
                    AFTER_STEP(step)
    finally:
        for h in handles:
            h.remove()
    return Trained(c, rec, losses)

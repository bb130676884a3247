"""Which module calls are per-example, and exact per-example gradients of the ones that are not.

The probe records every call of a measured module (:func:`record_calls`). Two facts about a call
are decided by behaviour, never guessed from shapes:

- **What an embedding gathered.** An ``nn.Embedding`` subclass may compute its indices itself
  (BART's learned positions take ``inputs_embeds[:, :, -1]``, floats, and gather
  ``arange(T) + 2``) or rescale the gather (``BartScaledWordEmbedding``'s ``embed_scale``). While
  such a module runs, a :class:`torch.overrides.TorchFunctionMode` records each
  ``F.embedding(indices, weight)`` on the module's own weight: the call's input is the true
  indices and its output the raw gather, so whatever the module does around it is differentiated
  by autograd, not assumed. A module that never calls ``F.embedding`` on its weight has no
  recorded call (its row says ``no_embedding_gather``).
- **Whether a call's output is per-example** (row ``i`` of its output influences example ``i``
  only). A call whose output has no leading batch axis of size ``n`` is batch-free (a position
  table ``pos(arange(T))``, T5's ``relative_attention_bias`` on ``(T, T)`` buckets). One with a
  leading axis of size ``n`` is tested (:func:`broadcast_calls`): the gradient of the loss of one
  example (the one with the most scored targets) with respect to the call's output must vanish
  exactly on every other row; otherwise the call is broadcast over the batch (``T == n``). The
  decision depends on the architecture and the fixed probe batch only, so it is cached per call
  layout and costs one extra backward on the first measurement.

A broadcast call's per-example output gradients come from one backward per example, batched by
``torch.autograd.grad(..., is_grads_batched=True)`` in chunks (a loop where vmap is unsupported),
then its input is expanded over the batch: exact, at the cost of ``n`` backward passes through the
part of the network above it. A batch-of-one call (HF position ids ``(1, T)``) is expanded at
forward time instead (free).

Example
-------
>>> import torch
>>> emb = torch.nn.Embedding(6, 2)
>>> with record_calls({"e": emb}, n=2) as seen:
...     _ = emb(torch.tensor([[1, 2], [3, 4]]))
>>> [tuple(call.inp.tolist()[0]) for call in seen.calls["e"]], sorted(seen.ran)
([(1, 2)], ['e'])
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from stepscope.errors import Refusal
from stepscope.probe.sequence import check_module, measured_parameters, module_kind

#: most elements of one chunk of batched grad_outputs (examples x scored rows x classes)
BATCHED_GRAD_ELEMENTS = 1 << 24


@dataclass
class Call:
    """One recorded call of a measured module: its (true) input, its output, the input version."""

    inp: Tensor
    out: Tensor
    version: int


class _GatherCapture(TorchFunctionMode):
    """Records ``F.embedding`` calls on one weight; returns a clone (in-place safety)."""

    def __init__(self, weight: Tensor, n: int, sink: list[Call]) -> None:
        super().__init__()
        self.weight, self.n, self.sink = weight, n, sink

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        if func is F.embedding and weight is self.weight:
            idx = args[0] if args else kwargs["input"]
            if out.dim() and out.shape[0] == 1 < self.n and idx.dim() and idx.shape[0] == 1:
                idx, out = idx.expand(self.n, *idx.shape[1:]), out.expand(self.n, *out.shape[1:])
            self.sink.append(Call(idx, out, idx._version))
            return out.clone()
        return out


@dataclass
class Recorded:
    """What :func:`record_calls` saw: the calls per module, which modules ran at all, and the
    modules whose calls the probe refused (module -> reason, filled by the caller)."""

    calls: dict[str, list[Call]]
    ran: set[str]
    refused: dict[str, str] = field(default_factory=dict)


def _input_of(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else next(iter(kwargs.values()))


@contextmanager
def record_calls(modules: dict[str, nn.Module], n: int) -> Iterator[Recorded]:
    """Record every call of ``modules`` during the block (hooks and modes removed on exit)."""
    recorded = Recorded({name: [] for name in modules}, set())
    seen = recorded.calls
    active: list[_GatherCapture] = []
    handles = []

    def pre(name: str, module: nn.Module) -> Any:
        def hook(_module: nn.Module, _args: tuple) -> None:
            recorded.ran.add(name)
            mode = _GatherCapture(module.get_parameter("weight"), n, seen[name])
            mode.__enter__()
            active.append(mode)

        return hook

    def post_gather(_module: nn.Module, _args: tuple, _out: Tensor) -> None:
        active.pop().__exit__(None, None, None)

    def post(name: str) -> Any:
        def hook(_module: nn.Module, args: tuple, kwargs: dict, out: Tensor) -> Any:
            recorded.ran.add(name)
            inp = _input_of(args, kwargs)
            if out.dim() and out.shape[0] == 1 < n and inp.dim() and inp.shape[0] == 1:
                # a batch-of-one call broadcast over the batch: hand the network the broadcast
                # it would form anyway, so each example gets its own rows
                inp = inp.expand(n, *inp.shape[1:])
                out = out.expand(n, *out.shape[1:])
            seen[name].append(Call(inp, out, inp._version))
            return out.clone()  # downstream in-place ops must not overwrite what we differentiate

        return hook

    try:
        for name, module in modules.items():
            if module_kind(module) == "embedding":
                handles.append(module.register_forward_pre_hook(pre(name, module)))
                handles.append(module.register_forward_hook(post_gather))
            else:
                handles.append(module.register_forward_hook(post(name), with_kwargs=True))
        yield recorded
    finally:
        for handle in handles:
            handle.remove()
        while active:  # a forward that raised inside an embedding
            active.pop().__exit__(None, None, None)


def parameter_owners(
    model: nn.Module, layers: dict[str, nn.Module]
) -> tuple[dict[int, list[tuple[str, str]]], dict[str, nn.Module]]:
    """Every ``(module name, attribute)`` that holds a measured layer's parameters.

    Returns ``param id -> owners`` and the modules to hook (measured layers plus any module that
    shares one of their parameters, e.g. the token embedding of a tied LM head).

    Raises
    ------
    Refusal
        ``probe_layer_unsupported`` when a sharing module has no per-example rule.
    """
    wanted = {
        id(getattr(m, part)): getattr(m, part)
        for m in layers.values()
        for part in measured_parameters(m)
    }
    owners: dict[int, list[tuple[str, str]]] = {pid: [] for pid in wanted}
    hooked: dict[str, nn.Module] = dict(layers)
    for name, module in model.named_modules():
        for attr, p in module._parameters.items():
            if p is None or id(p) not in owners:
                continue
            if name not in layers:
                if attr not in ("weight", "bias"):
                    raise Refusal(
                        "probe_layer_unsupported",
                        f"module {name!r} ({type(module).__name__}) shares a measured parameter "
                        f"as {attr!r}; its contribution has no per-example rule",
                        ["exclude the shared parameter's layers via layers=[...]"],
                    )
                check_module(name, module)
                hooked[name] = module
            owners[id(p)].append((name, attr))
    return owners, hooked


def broadcast_flags(
    logits: Tensor,
    logit_grad: Tensor,
    owner: Tensor,
    calls: list[tuple[str, Tensor, Tensor]],
    n: int,
    cache: dict[tuple, list[bool]] | None,
) -> tuple[list[bool], int]:
    """Per call: broadcast over the batch (no leading batch axis, or rows shared by examples);
    and the backward passes the test spent (0 when ``cache`` knew the layout)."""
    key = tuple((name, tuple(out.shape)) for name, _, out in calls)
    if cache is not None and key in cache:
        return cache[key], 0
    batched = [i for i, (_, _, out) in enumerate(calls) if out.dim() and out.shape[0] == n]
    flags = [True] * len(calls)
    tested = broadcast_calls(logits, logit_grad, owner, [calls[i][2] for i in batched], n)
    for i, flag in zip(batched, tested):
        flags[i] = flag
    if cache is not None:
        cache[key] = flags
    return flags, int(bool(batched))


def _example_rows(logit_grad: Tensor, owner: Tensor, examples: Tensor) -> Tensor:
    """``(k, m, C)`` grad_outputs: row ``r`` of slice ``j`` kept iff ``owner[r] == examples[j]``."""
    mask = (owner.unsqueeze(0) == examples.unsqueeze(1)).to(logit_grad.dtype)
    return logit_grad.unsqueeze(0) * mask.unsqueeze(-1)


def broadcast_calls(
    logits: Tensor, logit_grad: Tensor, owner: Tensor, outs: list[Tensor], n: int
) -> list[bool]:
    """For each output with a leading axis of size ``n``: is it broadcast over the batch?

    One backward of a single example's loss (the one with the most scored targets): a
    per-example output gets an exactly zero gradient on every other row.
    """
    if not outs:
        return []
    counts = torch.bincount(owner, minlength=n)
    probe = counts.argmax().reshape(1)
    grads = torch.autograd.grad(
        logits,
        outs,
        grad_outputs=_example_rows(logit_grad, owner, probe)[0],
        retain_graph=True,
        allow_unused=True,
    )
    others = torch.arange(n, device=owner.device) != probe
    flags = [g is not None and bool((g[others] != 0).any()) for g in grads]
    return flags


def per_example_output_grads(
    logits: Tensor, logit_grad: Tensor, owner: Tensor, outs: list[Tensor], n: int
) -> list[Tensor]:
    """``(n, *out.shape)`` per-example loss gradients of each (broadcast) output, exactly."""
    if not outs:
        return []
    per_row = max(1, logit_grad.numel())
    chunk = max(1, BATCHED_GRAD_ELEMENTS // per_row)
    parts: list[list[Tensor]] = [[] for _ in outs]
    for start in range(0, n, chunk):
        examples = torch.arange(start, min(n, start + chunk), device=owner.device)
        rows = _example_rows(logit_grad, owner, examples)
        try:
            grads = torch.autograd.grad(
                logits, outs, rows, retain_graph=True, allow_unused=True, is_grads_batched=True
            )
        except (RuntimeError, NotImplementedError):  # an op without a batching rule: loop
            single = [
                torch.autograd.grad(logits, outs, r, retain_graph=True, allow_unused=True)
                for r in rows
            ]
            grads = tuple(
                torch.stack([s[j] if s[j] is not None else torch.zeros_like(o) for s in single])
                for j, o in enumerate(outs)
            )
        for j, (g, o) in enumerate(zip(grads, outs)):
            parts[j].append(g if g is not None else o.new_zeros(len(examples), *o.shape))
    return [torch.cat(p) for p in parts]


__all__ = [
    "Call",
    "Recorded",
    "broadcast_calls",
    "broadcast_flags",
    "parameter_owners",
    "per_example_output_grads",
    "record_calls",
]

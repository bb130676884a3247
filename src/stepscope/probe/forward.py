"""The probe's single forward and backward: capture ``A``/``Z``, get ``B`` by ``autograd.grad``.

Forward hooks keep each measured layer's input and output and hand the rest of the network a
*clone* of the output, so in-place activations downstream (``ReLU(inplace=True)``) cannot
overwrite the tensor we differentiate with respect to. ``torch.autograd.grad`` of the summed
cross-entropy with respect to those outputs yields ``B`` at per-example scale without touching any
``.grad`` buffer. All device results travel to the host in one batched transfer.

Example
-------
>>> import torch
>>> lin = torch.nn.Linear(3, 2)
>>> fwd = run_probe_forward(lin, {"": lin}, torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
>>> host = fwd.to_host()
>>> host.model.n_examples, sorted(host.layers[""])
(4, ['bias', 'weight'])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from stepscope.errors import Refusal
from stepscope.probe.moments import BlockTensors, affine_factors, block_tensors
from stepscope.probe.recorder import ModelRecord


@dataclass
class HostResults:
    """Host copies: per-layer ``(sq_norms, ||G||^2)`` per block, zero counts, model record."""

    layers: dict[str, dict[str, tuple[np.ndarray, float]]]
    zero_counts: dict[str, tuple[int, int, int, int]]
    model: ModelRecord


@dataclass
class ProbeForward:
    """Device-side results of one probe forward/backward."""

    n: int
    dtype: torch.dtype
    blocks: dict[str, BlockTensors]
    zero_counts: dict[str, torch.Tensor]
    loss_sum: torch.Tensor
    logits: torch.Tensor
    labels: torch.Tensor
    absent: dict[str, str] = field(default_factory=dict)

    def to_host(self) -> HostResults:
        """One batched device-to-host transfer, then unpack (float64 for the n-length arrays)."""
        n, classes = self.logits.shape
        preds = self.logits.argmax(1)
        top = self.logits.max(1, keepdim=True).values
        ties = ((self.logits == top).sum(1) > 1).sum()
        confusion = torch.bincount(self.labels * classes + preds, minlength=classes * classes)
        parts: list[torch.Tensor] = [self.loss_sum.reshape(1), ties.reshape(1), confusion]
        layout: list[tuple[str, str, int]] = []
        for name, b in self.blocks.items():
            for part, sq, total in (
                ("weight", b.weight_sq, b.weight_sum),
                ("bias", b.bias_sq, b.bias_sum),
            ):
                if sq is None or total is None:
                    continue
                flat = total.reshape(-1)
                parts += [sq.reshape(-1), torch.dot(flat, flat).reshape(1)]
                layout.append((name, part, sq.numel()))
            parts.append(self.zero_counts[name])
        flat_host = torch.cat([p.detach().to(torch.float64) for p in parts]).cpu().numpy()
        loss_sum, tie_count = float(flat_host[0]), int(flat_host[1])
        conf = flat_host[2 : 2 + classes * classes].astype(np.int64).reshape(classes, classes)
        pos = 2 + classes * classes
        layers: dict[str, dict[str, tuple[np.ndarray, float]]] = {}
        zero_counts: dict[str, tuple[int, int, int, int]] = {}
        names = list(self.blocks)
        for name in names:
            layers[name] = {}
            for lname, part, size in layout:
                if lname != name:
                    continue
                sum_sq = float(flat_host[pos + size])  # ||sum_i g_i||^2; ||G||^2 = sum_sq / n^2
                layers[name][part] = (flat_host[pos : pos + size].copy(), sum_sq / (n * n))
                pos += size + 1
            counts = flat_host[pos : pos + 4].astype(np.int64)
            zero_counts[name] = (int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]))
            pos += 4
        correct = int(np.trace(conf))
        model = ModelRecord(
            loss=loss_sum / n if np.isfinite(loss_sum) else None,
            accuracy_fraction=correct / n,
            n_examples=int(n),
            n_correct=correct,
            num_classes=int(classes),
            predicted_counts=[int(v) for v in conf.sum(0)],
            confusion=conf.tolist(),
            argmax_tie_count=tie_count,
        )
        return HostResults(layers, zero_counts, model)


def run_probe_forward(
    model: torch.nn.Module, layers: dict[str, torch.nn.Module], x: torch.Tensor, y: torch.Tensor
) -> ProbeForward:
    """Run one forward and one backward of the probe through ``model`` (already in eval mode).

    Raises
    ------
    Refusal
        ``probe_output_invalid`` if the output is not ``(n, classes)`` logits covering the labels;
        ``probe_layer_unsupported`` if a measured module runs more than once per forward, or its
        input is modified in place after the module ran.
    """
    captured: dict[str, list[tuple[torch.Tensor, torch.Tensor, int]]] = {n: [] for n in layers}

    def make_hook(name: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> Any:
            inp = args[0] if args else kwargs["input"]
            captured[name].append((inp, output, inp._version))
            return (
                output.clone()
            )  # downstream in-place ops must not overwrite what we differentiate

        return hook

    handles = [m.register_forward_hook(make_hook(n), with_kwargs=True) for n, m in layers.items()]
    try:
        with torch.enable_grad():
            xin = x.detach().requires_grad_(True) if x.is_floating_point() else x
            logits = model(xin)
    finally:
        for handle in handles:
            handle.remove()
    _check_logits(logits, y)
    absent: dict[str, str] = {}
    outputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, calls in captured.items():
        if len(calls) > 1:
            raise Refusal(
                "probe_layer_unsupported",
                f"layer {name!r} ran {len(calls)} times in one forward; per-example gradients "
                "would mix its calls",
                ["exclude shared/reused modules via layers=[...]"],
            )
        if not calls:
            absent[name] = "not_executed"
            continue
        inp, out, version = calls[0]
        if inp._version != version:
            raise Refusal(
                "probe_layer_unsupported",
                f"the input of layer {name!r} was modified in place after the layer ran",
                ["avoid in-place ops on tensors that feed a measured layer"],
            )
        if not out.requires_grad:
            absent[name] = "no_gradient_path"
            continue
        outputs[name] = (inp.detach(), out)
    with torch.enable_grad():
        loss_sum = F.cross_entropy(logits, y, reduction="sum")
        names = list(outputs)
        grads = (
            torch.autograd.grad(loss_sum, [outputs[k][1] for k in names], allow_unused=True)
            if names and loss_sum.requires_grad
            else [None] * len(names)
        )
    blocks: dict[str, BlockTensors] = {}
    zero_counts: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, grad in zip(names, grads):
            if grad is None:
                absent[name] = "no_gradient_path"
                continue
            inp = outputs[name][0]
            module = layers[name]
            a, b = affine_factors(module, inp, grad)
            blocks[name] = block_tensors(a, b, with_bias=module.bias is not None)
            zero_counts[name] = torch.stack(
                [
                    (inp == 0).sum(),
                    torch.tensor(inp.numel(), device=inp.device),
                    (grad == 0).sum(),
                    torch.tensor(grad.numel(), device=grad.device),
                ]
            )
    return ProbeForward(
        n=int(y.shape[0]),
        dtype=logits.dtype,
        blocks=blocks,
        zero_counts=zero_counts,
        loss_sum=loss_sum.detach(),
        logits=logits.detach(),
        labels=y,
        absent=absent,
    )


def _check_logits(logits: Any, y: torch.Tensor) -> None:
    ok = isinstance(logits, torch.Tensor) and logits.dim() == 2 and logits.is_floating_point()
    if (
        ok
        and logits.shape[0] == y.shape[0]
        and int(y.max()) < logits.shape[1]
        and int(y.min()) >= 0
    ):
        return
    shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    raise Refusal(
        "probe_output_invalid",
        f"model output {shape} is not (n={y.shape[0]}, classes) logits covering the labels",
        ["wrap the model so it returns (n, classes) logits", "check the label range"],
    )

"""The probe's single forward and backward: capture inputs/outputs, get ``B`` by ``autograd.grad``.

Forward hooks keep every call's input and output of each module that owns a measured parameter
(a tied weight brings in every module that shares it) and hand the rest of the network a *clone*
of the output, so in-place activations downstream (``ReLU(inplace=True)``) cannot overwrite the
tensor we differentiate with respect to. ``torch.autograd.grad`` of the summed cross-entropy (over
every scored target: one per example, or every scored token of a sequence) with respect to those
outputs yields ``B`` at per-example scale without touching any ``.grad`` buffer; per-example
gradients follow from :mod:`stepscope.probe.sequence`. All device results travel to the host in
one batched transfer.

Confusion: with at most ``confusion_cap`` classes the dense ``C x C`` matrix is recorded; above
it (a 50,257-token vocabulary) only predicted-class counts, per-true-class error counts and the
``top_k`` most frequent ``(true, predicted)`` error pairs, in ``O(C + targets)`` memory.

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

import numpy as np
import torch
import torch.nn.functional as F

from stepscope.errors import Refusal
from stepscope.probe.calls import (
    Recorded,
    broadcast_flags,
    parameter_owners,
    per_example_output_grads,
    record_calls,
)
from stepscope.probe.crossentropy import ce_logit_gradient, underflowed_targets
from stepscope.probe.moments import BlockTensors
from stepscope.probe.outputs import OutputSelector, ScoredTargets, score_targets, select_logits
from stepscope.probe.recorder import ModelRecord
from stepscope.probe.sequence import (
    elementwise_affine_mismatch,
    measured_parameters,
    module_kind,
    module_use,
    parameter_sq_norms_and_sum,
)

#: above this many classes the confusion is bounded (no dense C x C matrix)
CONFUSION_CLASS_CAP = 1024
#: most frequent (true, predicted) error pairs kept above the cap
CONFUSION_TOP_K = 32


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
    logits: torch.Tensor  #: ``(m, C)`` scored logit rows
    labels: torch.Tensor  #: ``(m,)`` their labels
    absent: dict[str, str] = field(default_factory=dict)
    confusion_cap: int = CONFUSION_CLASS_CAP
    top_k: int = CONFUSION_TOP_K
    shared: dict[str, list[str]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    #: backward passes spent: 1, plus the broadcast test (first measurement) and one per example
    #: when a call is broadcast over the batch (stepscope.probe.calls)
    backward_passes: int = 1

    def _confusion_parts(self) -> tuple[list[torch.Tensor], bool]:
        classes = self.logits.shape[1]
        preds = self.logits.argmax(1)
        if classes <= self.confusion_cap:
            cells = torch.bincount(self.labels * classes + preds, minlength=classes * classes)
            return [cells], False
        wrong = preds != self.labels
        keys = self.labels[wrong] * classes + preds[wrong]
        unique, counts = torch.unique(keys, return_counts=True)  # ascending keys
        order = torch.sort(counts, descending=True, stable=True).indices[: self.top_k]
        k = torch.tensor([float(order.numel())], device=keys.device)
        return [
            torch.bincount(preds, minlength=classes),
            torch.bincount(self.labels[wrong], minlength=classes),
            k,
            unique[order],
            counts[order],
        ], True

    def to_host(self) -> HostResults:
        """One batched device-to-host transfer, then unpack (float64 for the n-length arrays)."""
        n = self.n
        m, classes = self.logits.shape
        top = self.logits.max(1, keepdim=True).values
        ties = ((self.logits == top).sum(1) > 1).sum()
        confusion, bounded = self._confusion_parts()
        underflow = underflowed_targets(self.logits, self.labels).reshape(1)
        parts: list[torch.Tensor] = [
            self.loss_sum.reshape(1),
            ties.reshape(1),
            underflow,
            *confusion,
        ]
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
        loss_sum, tie_count, underflow_count = (float(v) for v in flat_host[:3])
        pos = 3
        if bounded:
            predicted = flat_host[pos : pos + classes].astype(np.int64)
            errors = flat_host[pos + classes : pos + 2 * classes].astype(np.int64)
            k = int(flat_host[pos + 2 * classes])
            pos += 2 * classes + 1
            keys = flat_host[pos : pos + k].astype(np.int64)
            counts = flat_host[pos + k : pos + 2 * k].astype(np.int64)
            pos += 2 * k
            correct = int(m - errors.sum())
            conf: list[list[int]] = []
            pairs = [[int(t // classes), int(t % classes), int(c)] for t, c in zip(keys, counts)]
            per_class = [int(v) for v in errors]
        else:
            dense = flat_host[pos : pos + classes * classes].astype(np.int64)
            dense = dense.reshape(classes, classes)
            pos += classes * classes
            predicted, correct = dense.sum(0), int(np.trace(dense))
            conf, pairs, per_class = dense.tolist(), None, None
        layers: dict[str, dict[str, tuple[np.ndarray, float]]] = {}
        zero_counts: dict[str, tuple[int, int, int, int]] = {}
        for name in self.blocks:
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
        model = ModelRecord(
            loss=loss_sum / m if np.isfinite(loss_sum) and m else None,
            accuracy_fraction=correct / m if m else None,
            n_examples=int(n),
            n_correct=correct,
            num_classes=int(classes),
            predicted_counts=[int(v) for v in predicted],
            confusion=conf,
            argmax_tie_count=int(tie_count),
            n_targets=int(m),
            confusion_mode="bounded" if bounded else "dense",
            confusion_class_cap=self.confusion_cap,
            per_class_errors=per_class,
            top_confused_pairs=pairs,
            logit_gradient_underflow_targets=int(underflow_count),
        )
        return HostResults(layers, zero_counts, model)


def run_probe_forward(
    model: torch.nn.Module,
    layers: dict[str, torch.nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    output: OutputSelector = None,
    next_token: bool = False,
    confusion_cap: int = CONFUSION_CLASS_CAP,
    layout_cache: dict[tuple, list[bool]] | None = None,
) -> ProbeForward:
    """Run one forward and one backward of the probe through ``model`` (already in eval mode).

    Parameters
    ----------
    output, next_token
        Logit selection and target alignment (:mod:`stepscope.probe.outputs`).
    confusion_cap
        Largest class count recorded as a dense confusion matrix.
    layout_cache
        Which calls are broadcast over the batch, per call layout (:mod:`stepscope.probe.calls`;
        a :class:`~stepscope.probe.dense.DenseProbe` keeps one, so the test runs once).

    Raises
    ------
    Refusal
        ``probe_output_invalid`` if the selected output does not align with the labels;
        ``probe_layer_unsupported`` if a measured module's input is modified in place after the
        module ran, or a module sharing a measured parameter has no per-example rule.
    """
    owners, hooked = parameter_owners(model, layers)
    n = x.shape[0]
    with record_calls(hooked, n) as recorded, torch.enable_grad():
        xin = x.detach().requires_grad_(True) if x.is_floating_point() else x
        raw = model(xin)
    scored = score_targets(select_logits(raw, output), y, next_token=next_token)
    calls: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (module, input, output)
    for name, seen in recorded.calls.items():
        for call in seen:
            if call.inp._version != call.version:
                raise Refusal(
                    "probe_layer_unsupported",
                    f"the input of layer {name!r} was modified in place after the layer ran",
                    ["avoid in-place ops on tensors that feed a measured layer"],
                )
            if not call.out.requires_grad:
                continue
            if module_kind(hooked[name]) == "elementwise_affine":
                why = elementwise_affine_mismatch(hooked[name], call.inp, call.out)
                if why is not None:
                    recorded.refused[name] = why
                    continue
            calls.append((name, call.inp.detach(), call.out))
    live: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    passes = 0
    with torch.enable_grad():
        loss_sum = F.cross_entropy(scored.logits, scored.labels, reduction="sum")
        # the cancellation-free logit gradient (stepscope.probe.crossentropy), not torch's
        # p_y - 1, which is exactly 0 for a confident prediction
        logit_grad = ce_logit_gradient(scored.logits, scored.labels)
        if calls and scored.logits.requires_grad:
            broadcast, passes = broadcast_flags(
                scored.logits, logit_grad, scored.owner, calls, n, layout_cache
            )
            batched = [c for c, b in zip(calls, broadcast) if not b]
            spread = [c for c, b in zip(calls, broadcast) if b]
            grads = torch.autograd.grad(
                scored.logits,
                [c[2] for c in batched],
                grad_outputs=logit_grad,
                allow_unused=True,
                retain_graph=bool(spread),
            )
            live = [(name, inp, g) for (name, inp, _), g in zip(batched, grads) if g is not None]
            spread_grads = per_example_output_grads(
                scored.logits, logit_grad, scored.owner, [c[2] for c in spread], n
            )
            for (name, inp, _), g in zip(spread, spread_grads):  # expand the input over the batch
                live.append((name, inp.expand(n, *inp.shape), g))
            passes += 1 + (n if spread else 0)
    fwd = _reduce(layers, hooked, owners, recorded, live, scored, loss_sum, confusion_cap)
    fwd.backward_passes = passes
    return fwd


def _zero_counts(inp: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Exact zeros and entries of a float input (token ids count as no entries) and backprop."""
    floating = inp.is_floating_point()
    entries = inp.numel() if floating else 0
    # count_nonzero: one pass, no boolean temporary
    zeros = entries - torch.count_nonzero(inp) if floating else grad.new_zeros((), dtype=torch.long)
    return torch.stack(
        [
            zeros,
            torch.tensor(entries, device=grad.device),
            grad.numel() - torch.count_nonzero(grad),
            torch.tensor(grad.numel(), device=grad.device),
        ]
    )


def _absent_reason(holders: set[str], recorded: Recorded) -> str:
    """Why a measured layer has no per-example gradient (no live use of any of its parameters)."""
    refused = [recorded.refused[h] for h in sorted(holders) if h in recorded.refused]
    if refused:
        return refused[0]
    if any(recorded.calls[h] for h in holders):
        return "no_gradient_path"
    if any(h in recorded.ran for h in holders):  # an embedding that never gathered its weight
        return "no_embedding_gather"
    return "not_executed"


def _reduce(
    layers: dict[str, torch.nn.Module],
    hooked: dict[str, torch.nn.Module],
    owners: dict[int, list[tuple[str, str]]],
    recorded: Recorded,
    live: list[tuple[str, torch.Tensor, torch.Tensor]],
    scored: ScoredTargets,
    loss_sum: torch.Tensor,
    confusion_cap: int,
) -> ProbeForward:
    """Per-parameter moments over all uses, mapped back to each measured layer's blocks.

    Every module that owns a parameter reports its total over all uses, also when the module
    itself never ran (T5's ``shared``, whose weight the encoder's ``embed_tokens`` uses).
    """
    absent: dict[str, str] = {}
    per_param: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    blocks: dict[str, BlockTensors] = {}
    zero_counts: dict[str, torch.Tensor] = {}
    shared: dict[str, list[str]] = {}
    n_calls: dict[str, int] = {}
    with torch.no_grad():
        for name, module in layers.items():
            mine = [(inp, g) for owner, inp, g in live if owner == name]
            params = [getattr(module, part) for part in measured_parameters(module)]
            holders = {o for p in params for o, _ in owners[id(p)]}
            if not any(owner in holders for owner, _, _ in live):
                absent[name] = _absent_reason(holders, recorded)
                continue
            n_calls[name] = len(mine)
            parts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
            for part in measured_parameters(module):
                p = getattr(module, part)
                if id(p) not in per_param:
                    uses = [
                        module_use(hooked[owner], attr, inp, g)
                        for owner, attr in owners[id(p)]
                        for o, inp, g in live
                        if o == owner
                    ]
                    per_param[id(p)] = parameter_sq_norms_and_sum(uses, p.shape)
                parts[part] = per_param[id(p)]
                others = sorted({o for o, _ in owners[id(p)] if o != name})
                if others or len(mine) > 1:
                    shared[f"{name}.{part}"] = others
            weight = parts.get("weight")
            bias = parts.get("bias")
            blocks[name] = BlockTensors(
                weight_sq=weight[0] if weight else None,
                weight_sum=weight[1] if weight else None,
                bias_sq=bias[0] if bias else None,
                bias_sum=bias[1] if bias else None,
            )
            if mine:
                zero_counts[name] = torch.stack([_zero_counts(i, g) for i, g in mine]).sum(0)
            else:  # a tied owner that never ran: its totals, but no activations of its own
                zero_counts[name] = torch.zeros(4, dtype=torch.long, device=loss_sum.device)
    return ProbeForward(
        n=scored.n,
        dtype=scored.logits.dtype,
        blocks=blocks,
        zero_counts=zero_counts,
        loss_sum=loss_sum.detach(),
        logits=scored.logits.detach(),
        labels=scored.labels,
        absent=absent,
        confusion_cap=confusion_cap,
        shared=shared,
        calls=n_calls,
    )

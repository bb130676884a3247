"""A small real training loop that does by hand what the collector (``stepscope.collect``) does.

Forward hooks capture module outputs; parameters, gradients and updates are read around
``optimizer.step()``; every tensor is reduced with the real kernels (``reduce_spines`` /
``reduce_histograms``), written with ``HistoryWriter.write_step`` and converted with
``events_from_step`` — the contract the collector follows.
"""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from stepscope.events import EventBus, events_from_step
from stepscope.history import HistoryWriter, ObservationBatch, RunRecord, StepBlockRecord
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence
from stepscope.stats import SPINE_WIDTH, HistogramDescriptor, reduce_histograms, reduce_spines

LINEARS = ("fc1", "fc2", "fc3")


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(8, 16),
            relu1=nn.ReLU(),
            fc2=nn.Linear(16, 16),
            relu2=nn.ReLU(),
            fc3=nn.Linear(16, 3),
        )
    )


def fixed_run_record(run_id: str = "events-test") -> RunRecord:
    """A run record with fixed ids and times, so two runs write byte-identical artifacts."""
    return RunRecord(
        run_id=run_id,
        segment_id="seg0",
        histogram_descriptor=HistogramDescriptor().to_dict(),
        created_unix=0.0,
    )


def data(n_steps: int, batch: int = 16, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 8, generator=g), torch.randint(0, 3, (batch,), generator=g))
        for _ in range(n_steps)
    ]


def train(
    path,
    n_steps: int = 6,
    *,
    subscribers=(),
    bus: EventBus | None = None,
    inject_nan: tuple[int, str] | None = None,
    lr: float = 0.1,
    hist_every: int = 1,
    loss_scale: float = 1.0,
    skip_activation_site: tuple[int, str] | None = None,
    fc1_bias: float | None = None,
    batch: int = 16,
    stop_on: object = None,
):
    """Train an MLP for ``n_steps`` SGD steps, writing an artifact and publishing events.

    ``inject_nan=(step, "fc2")`` writes NaN into ``fc2.weight[0, 0]`` before that step's forward.
    ``skip_activation_site=(step, "relu1")`` marks that cell ``not_scheduled``.
    ``stop_on`` (a check) ends training when its ``should_stop`` is set.
    Returns a namespace with the model, every published event list and the steps run.
    """
    model = mlp()
    if fc1_bias is not None:
        with torch.no_grad():
            model.fc1.bias.fill_(fc1_bias)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    desc = HistogramDescriptor()
    writer = HistoryWriter(  # no fsync: durability is tested in tests/history
        path, fixed_run_record(), commit_steps=2, commit_seconds=None, durable=False
    )
    bus = bus if bus is not None else EventBus(capacity=100_000)
    for s in subscribers:
        bus.subscribe(s)
    names = [n for n, _ in model.named_children()]
    ids = {
        n: writer.register_site(n, type(m).__module__ + "." + type(m).__name__, "f32")
        for n, m in model.named_children()
    }
    captured: dict[str, torch.Tensor] = {}
    handles = [
        m.register_forward_hook(lambda _m, _i, out, n=n: captured.__setitem__(n, out.detach()))
        for n, m in model.named_children()
    ]
    published, steps_run = [], []
    examples = 0
    try:
        for step, (x, y) in enumerate(data(n_steps, batch)):
            if inject_nan is not None and inject_nan[0] == step:
                with torch.no_grad():
                    getattr(model, inject_nan[1]).weight[0, 0] = float("nan")
            captured.clear()
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            (loss * loss_scale).backward()
            weights = [getattr(model, n).weight for n in LINEARS]
            before = [w.detach().clone() for w in weights]
            opt.step()
            examples += len(x)
            scale = "scaled" if loss_scale != 1 else "unscaled"  # how .grad was scaled
            batches = _batches(
                names,
                ids,
                captured,
                weights,
                before,
                desc,
                step,
                hist_every,
                skip_activation_site,
                scale,
            )
            block = StepBlockRecord(step, examples_seen=examples, epoch=examples // 64)
            scalars = {"loss": float(loss.detach())}
            writer.write_step(block, batches, scalars=scalars)
            events = events_from_step(block, batches, writer.sites, writer.descriptor, scalars)
            published.append(events)
            steps_run.append(step)
            bus.publish(events)
            if stop_on is not None and stop_on.should_stop:
                break
    finally:
        for h in handles:
            h.remove()
        writer.close()
        bus.close()
    return SimpleNamespace(model=model, events=published, steps=steps_run, bus=bus, writer=writer)


def _batches(names, ids, captured, weights, before, desc, step, hist_every, skip, scale):
    act_names = list(names)
    acts = [captured[n] for n in act_names]
    spines = reduce_spines(acts).numpy()
    presence = np.full(len(act_names), code_of(Presence.OBSERVED), np.uint8)
    if skip is not None and skip[0] == step:
        i = act_names.index(skip[1])
        presence[i] = code_of(Presence.NOT_SCHEDULED)
        spines[i] = np.nan
    observed_rows = np.flatnonzero(presence == code_of(Presence.OBSERVED))
    hist = {}
    if step % hist_every == 0:
        hist = {
            "hist_rows": observed_rows,
            "histograms": reduce_histograms([acts[i] for i in observed_rows], desc).numpy(),
        }
    act = ObservationBatch(
        "activation", "forward", [ids[n] for n in act_names], presence, spines, **hist
    )
    lin = [ids[n] for n in LINEARS]
    grads = [w.grad for w in weights]
    grad = ObservationBatch.observed(
        "gradient",
        "pre_step",
        lin,
        reduce_spines(grads).numpy(),
        hist_rows=np.arange(len(lin)),
        histograms=reduce_histograms(grads, desc).numpy(),
        scale_grad=scale,
    )
    param = ObservationBatch.observed("parameter", "pre_step", lin, reduce_spines(before).numpy())
    updates = [w.detach() - b for w, b in zip(weights, before)]
    upd = ObservationBatch.observed("update", "post_step", lin, reduce_spines(updates).numpy())
    return [act, grad, param, upd]


def np_spine_scalars(x: torch.Tensor) -> dict[str, float | None]:
    """Published scalars computed directly with float64 numpy (the test oracle)."""
    a = x.detach().double().numpy().ravel()
    f = a[np.isfinite(a)]
    has = f.size > 0
    return {
        "l2": float(np.sqrt((f * f).sum())) if has else None,
        "mean": float(f.mean()) if has else None,
        "std": float(f.std()) if has else None,
        "min": float(f.min()) if has else None,
        "max": float(f.max()) if has else None,
        "absmax": float(np.abs(f).max()) if has else None,
        "zero_fraction": float((a == 0).mean()) if a.size else None,
        "nonfinite_count": float((~np.isfinite(a)).sum()),
    }


@pytest.fixture(scope="session")
def ev():
    """The helpers above as one fixture (tests use it rather than importing conftest)."""
    return SimpleNamespace(
        mlp=mlp,
        train=train,
        data=data,
        np_spine_scalars=np_spine_scalars,
        fixed_run_record=fixed_run_record,
        LINEARS=LINEARS,
        SPINE_WIDTH=SPINE_WIDTH,
    )

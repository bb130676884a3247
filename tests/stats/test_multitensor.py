"""Multi-tensor reductions: one native call per parameter-sized stream and step, rows identical
to reducing each tensor on its own."""

import torch
import torch.nn.functional as F

from stepscope.collect import Cadence, HistoryCollector, WatchSettings
from stepscope.collect import staging as staging_mod
from stepscope.stats import SPINE_WIDTH, _native, reduce_spines, spines_into


def mixed_tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, 7, generator=g)
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), 0.0
    return [
        x,
        x.t(),  # non-contiguous
        torch._neg_view(x),  # lazy negation
        x.double(),
        x.half(),
        torch.empty(0),
        torch.randint(-5, 5, (33,), generator=g),
        x[:, 3],
    ]


def test_spines_into_rows_equal_one_reduction_per_tensor(backend):
    ts = mixed_tensors()
    rows = [7, 0, 3, 1, 6, 2, 4, 5]
    out = torch.full((8, SPINE_WIDTH), -1.0, dtype=torch.float64)
    spines_into(ts, out, rows, backend)
    for t, r in zip(ts, rows):
        want = reduce_spines([t], backend=backend)[0]
        torch.testing.assert_close(out[r], want, rtol=0, atol=0, equal_nan=True)


def test_one_native_call_per_parameter_stream_and_step(monkeypatch):
    if _native.backend_info()["cpu"] != "c":
        import pytest

        pytest.skip("C kernel unavailable")
    calls: list[int] = []
    real = staging_mod.spines_into

    def counting(tensors, out, rows, backend="auto"):
        calls.append(len(tensors))
        return real(tensors, out, rows, backend)

    per_tensor: list[int] = []
    real_one = staging_mod.spine_into
    monkeypatch.setattr(staging_mod, "spines_into", counting)
    monkeypatch.setattr(
        staging_mod, "spine_into", lambda *a, **k: per_tensor.append(1) or real_one(*a, **k)
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    col = HistoryCollector(
        model,
        streams=("gradient", "parameter", "update"),
        cadence=Cadence(1, None),
        settings=WatchSettings(),
    )
    try:
        for _ in range(3):
            with col.step(opt):
                loss = F.cross_entropy(model(torch.randn(8, 1, 8, 8)), torch.randint(0, 10, (8,)))
                opt.zero_grad()
                loss.backward()
                opt.step()
        n_params = len(list(model.parameters()))
        assert calls == [n_params] * 9  # 3 streams x 3 steps, each with every parameter at once
        assert per_tensor == []
        # and the recorded rows are the per-tensor spines (independent reduction, after the step)
        batches = {b.stream: b for b in col.last_batches}
        params = dict(model.named_parameters())
        names = {s.site_id: s.name for s in col.sites}
        for k, sid in enumerate(batches["parameter"].site_ids):
            want = reduce_spines([params[names[sid]]])[0].numpy()
            assert (batches["parameter"].spines[k] == want).all()
    finally:
        col.close()

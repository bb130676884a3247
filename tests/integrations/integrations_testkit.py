"""Independent oracles for the trainer-integration tests.

Gradient oracles read every parameter's ``.grad`` at the framework's own last event before the
optimizer consumes it (Lightning ``on_before_optimizer_step``, HF ``on_pre_optimizer_step``) and
reduce it in float64 with plain torch, independently of stepscope's kernels.
"""

from __future__ import annotations

import numpy as np
import torch

import stepscope as ss

FIELDS = ("total", "sum", "sum_squares", "min", "max")


def grad_facts(model: torch.nn.Module) -> dict[str, tuple[float, ...]]:
    """name -> (numel, sum, sum of squares, min, max) of each parameter's gradient, in float64."""
    out = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().double()
        out[name] = (
            g.numel(),
            g.sum().item(),
            g.square().sum().item(),
            g.min().item(),
            g.max().item(),
        )
    return out


def recorded_gradients(
    run: str, names: list[str], phase: str | None = None
) -> dict[int, dict[str, tuple[float, ...]]]:
    """step -> name -> the five gradient facts stepscope recorded (observed rows only)."""
    reader = ss.open_run(run)
    out: dict[int, dict[str, tuple[float, ...]]] = {}
    for name in names:
        cols = [reader.series(name, "gradient", f, phase=phase) for f in FIELDS]
        for i, step in enumerate(cols[0].steps.tolist()):
            if cols[0].valid[i]:
                out.setdefault(step, {})[name] = tuple(float(c.values[i]) for c in cols)
    return out


def assert_gradients_match(oracle: list[dict[str, tuple[float, ...]]], run: str) -> None:
    """Every step's recorded gradient rows equal what the optimizer consumed at that step."""
    names = sorted(oracle[0])
    recorded = recorded_gradients(run, names)
    assert sorted(recorded) == list(range(len(oracle))), "a gradient row per optimizer step"
    for step, expected in enumerate(oracle):
        for name in names:
            got, want = recorded[step][name], expected[name]
            assert got[0] == want[0], (step, name)
            np.testing.assert_allclose(
                got[1:], want[1:], rtol=1e-5, atol=1e-7, err_msg=f"{step} {name}"
            )


def state_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bitwise equality of two state dicts (parameters and buffers)."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def optimizer_state_equal(a: dict, b: dict) -> bool:
    """Bitwise equality of two optimizer ``state_dict()``s (state tensors and param groups)."""
    if a["param_groups"] != b["param_groups"] or a["state"].keys() != b["state"].keys():
        return False
    for k, sa in a["state"].items():
        sb = b["state"][k]
        if sa.keys() != sb.keys():
            return False
        for name, va in sa.items():
            vb = sb[name]
            same = torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb
            if not same:
                return False
    return True

"""An independent reading of what a torch optimizer consumed, taken where it consumes it.

:class:`Consumed` wraps one optimizer's ``_init_group`` (SGD, Adam, AdamW: the method every
``step()`` calls, after any closure, to gather the ``(parameter, gradient)`` pairs it will
update) and reduces each gathered gradient in float64 with plain torch, right there. So the
reading is after the closure (its backward, clipping, unscaling) and names exactly the
parameters the step updated: a parameter whose ``.grad`` is ``None`` is not gathered.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import stepscope as ss

FIELDS = ("total", "sum", "sum_squares", "min", "max")


def facts(g: torch.Tensor) -> tuple[float, ...]:
    """(numel, sum, sum of squares, min, max) of ``g`` in float64."""
    g = g.detach().double()
    return (g.numel(), g.sum().item(), g.square().sum().item(), g.min().item(), g.max().item())


class Consumed:
    """``steps[i][name]``: the facts of the gradient optimizer step ``i`` gathered for ``name``.

    Attach it before stepscope or after: it changes no tensor. ``names`` maps parameters to the
    names the collector records (``model.named_parameters()``).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: torch.nn.Module,
        steps: list[dict[str, tuple[float, ...]]] | None = None,
    ) -> None:
        self.names = {id(p): n for n, p in model.named_parameters()}
        #: shared by several optimizers' oracles: one entry per optimizer step, in order
        self.steps: list[dict[str, tuple[float, ...]]] = [] if steps is None else steps
        inner = optimizer._init_group  # the bound method of the optimizer's class

        def spy(group: dict, params: list, grads: list, *rest: Any, **kw: Any) -> Any:
            out = inner(group, params, grads, *rest, **kw)
            if group is optimizer.param_groups[0]:  # (load_state_dict replaces the groups)
                self.steps.append({})
            for p, g in zip(params, grads):
                self.steps[-1][self.names.get(id(p), str(id(p)))] = facts(g)
            return out

        optimizer._init_group = spy  # type: ignore[method-assign]


def recorded(run: Any, names: list[str], stream: str = "gradient") -> dict[int, dict[str, tuple]]:
    """step -> name -> the five facts stepscope recorded (observed rows only)."""
    reader = ss.open_run(run)
    out: dict[int, dict[str, tuple]] = {}
    for name in names:
        cols = [reader.series(name, stream, f) for f in FIELDS]
        for i, step in enumerate(cols[0].steps.tolist()):
            if cols[0].valid[i]:
                out.setdefault(step, {})[name] = tuple(float(c.values[i]) for c in cols)
    return out


def assert_rows_are_consumed(
    run: Any, oracle: list[dict[str, tuple]], names: list[str], steps: list[int] | None = None
) -> None:
    """Recorded step ``steps[i]``'s gradient rows are exactly optimizer step ``i``'s gathered
    gradients: the same parameters observed, the same numbers (rtol 1e-5)."""
    rec = recorded(run, names)
    steps = list(range(len(oracle))) if steps is None else steps
    for step, want in zip(steps, oracle):
        got = rec.get(step, {})
        want = {n: v for n, v in want.items() if n in names}
        assert sorted(got) == sorted(want), (step, sorted(set(got) ^ set(want)))
        for name, w in want.items():
            assert got[name][0] == w[0], (step, name)
            np.testing.assert_allclose(
                got[name][1:], w[1:], rtol=1e-5, atol=1e-9, err_msg=f"step {step} {name}"
            )


def update_presence(run: Any, step: int) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (presence, disclosures) of every ``update`` row recorded at ``step``."""
    reader = ss.open_run(run)
    by_id = {s.site_id: s.name for s in reader.sites}
    return {
        by_id[r.site_id]: (r.presence.value, tuple(r.disclosures))
        for r in reader.observations(stream="update", steps=(step, step))
    }

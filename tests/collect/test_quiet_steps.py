"""A quiet step (nothing due) runs a small, fixed amount of the collector's Python.

Speed is measured in ``benchmarks/quiet_step.py`` (``docs/benchmarks.md``), never asserted here:
these tests count what a quiet step *runs*, which no machine load changes. Every stepscope
function a quiet step calls is counted with ``sys.setprofile``: the count is below a budget
(:data:`QUIET_CALL_BUDGET`), is the same on a model with four times the modules and parameters
(nothing per row or per module), and no module hook of the collector runs.
"""

from __future__ import annotations

import collections
import gc
import sys
from pathlib import Path

import torch

import stepscope as ss

#: stepscope functions one quiet step may call (108 before the first trim; 72 before the second,
#: which counts the step's context manager, once contextlib's; 47 after it, 49 where the model's
#: own hooks cannot rest because this process compiled a frame: see test_root_rest.py)
QUIET_CALL_BUDGET = 49


def _mlp(pairs: int, width: int) -> torch.nn.Module:
    layers = [m for _ in range(pairs) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers)


def _quiet_step_calls(tmp_path: Path, pairs: int, width: int = 16) -> collections.Counter:
    torch.manual_seed(0)
    model = _mlp(pairs, width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, width)
    run_dir = tmp_path / f"run{pairs}"
    c = ss.HistoryCollector(model, settings=ss.WatchSettings(output_dir=str(run_dir)))

    def step() -> None:
        with c.step(opt, examples=4):
            loss = model(x).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()

    for _ in range(112):  # past the first cadence period: every residue seen once
        step()
    assert c._next_step % 10 != 0  # the next step is quiet at the default cadence
    calls: collections.Counter = collections.Counter()
    marker = f"{Path(ss.__file__).parent}"

    def profile(frame, event, _arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_filename.startswith(marker):
            calls[(Path(frame.f_code.co_filename).name, frame.f_code.co_name)] += 1

    gc.collect()  # an earlier collector's __del__ must not run inside the counted step
    gc.disable()
    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
        gc.enable()
    c.close()
    assert ss.open_run(run_dir).steps.tolist() == list(range(113))  # every step still written
    return calls


def test_a_quiet_step_calls_few_of_the_collectors_functions_and_no_module_hook(tmp_path):
    calls = _quiet_step_calls(tmp_path, pairs=8)
    assert sum(calls.values()) <= QUIET_CALL_BUDGET, calls.most_common()
    hooks = [k for k in calls if k[0] == "activations.py" and k[1] == "_forward_hook"]
    assert not hooks, hooks  # the module hooks are off on quiet steps
    assert not [k for k in calls if k[0] == "staging.py"]  # nothing is reduced or staged


def test_a_quiet_steps_work_does_not_grow_with_the_model(tmp_path):
    small = _quiet_step_calls(tmp_path, pairs=2, width=8)
    large = _quiet_step_calls(tmp_path, pairs=16, width=32)  # 8x the modules and parameters
    assert small == large, set(large.items()) ^ set(small.items())

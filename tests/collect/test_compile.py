"""``torch.compile`` in both orders: training runs, the collector causes no
graph break (counted by ``torch._dynamo.explain``), activation rows of compiled forwards are
``unsupported`` with reason ``torch_compile``, and optimizer-side streams are recorded exactly."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from stepscope.collect import Cadence, HistoryCollector
from stepscope.history import Presence
from stepscope.history.batch import member_of

ROOT = Path(__file__).resolve().parents[2]


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.mark.parametrize("order", ["compile_then_collect", "collect_then_compile"])
def test_compiled_models_train_without_graph_breaks_from_the_collector(order):
    torch._dynamo.reset()
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if order == "compile_then_collect":
        compiled = torch.compile(model, backend="eager")
        c = HistoryCollector(compiled, cadence=Cadence(1, 1))
    else:
        c = HistoryCollector(model, cadence=Cadence(1, 1))
        compiled = torch.compile(model, backend="eager")
    grads = []
    for _ in range(3):
        with c.step(opt):
            loss = compiled(torch.randn(5, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            grads.append(model[0].weight.grad.detach().double().pow(2).sum().item())
            opt.step()
    explain = torch._dynamo.explain(compiled)(torch.randn(5, 4))
    c.close()
    assert explain.graph_break_count == 0
    assert [s.name for s in c.sites] == ["0.weight", "0.bias", "2.weight", "2.bias", "0", "1", "2"]
    by_stream = {b.stream.value: b for b in c.last_batches}
    act = by_stream["activation"]
    assert [member_of(Presence, p) for p in act.presence] == [Presence.UNSUPPORTED] * 3
    assert act.row_disclosures == (("unsupported:torch_compile",),) * 3
    grad = by_stream["gradient"]
    assert all(member_of(Presence, p) is Presence.OBSERVED for p in grad.presence)
    # sum_squares of 0.weight's gradient: the kernel's 16-lane float64 sum against torch's own
    # order (its thread count decides it), equal within the documented n * 2**-52 bound
    assert grad.spines[0][11] == pytest.approx(grads[-1], rel=32 * 2**-52, abs=0)


def test_a_model_compiled_on_a_quiet_step_still_reads_unsupported_when_due():
    """Quiet steps take the module hooks off; a model compiled then (traced without them) is
    still noticed by the model's own hooks, so due steps read ``torch_compile``, never absent."""
    torch._dynamo.reset()
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, cadence=Cadence(3, None))
    compiled = None
    presence = {}
    for step in range(7):
        if step == 2:  # a quiet step
            compiled = torch.compile(model, backend="eager")
        with c.step(opt):
            loss = (compiled or model)(torch.randn(5, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        for b in c.last_batches:
            if b.stream.value == "activation":
                presence[step] = [member_of(Presence, p) for p in b.presence]
    c.close()
    assert presence[0] == [Presence.OBSERVED] * 3
    assert presence[3] == presence[6] == [Presence.UNSUPPORTED] * 3


COMPILED_STEP = textwrap.dedent(
    """
    import json, sys, torch
    from stepscope.collect import ALL_STREAMS, HistoryCollector, WatchSettings
    from tests.collect.models import ResNetish, TinyGPT
    from tests.collect.stepkit import ce, images, tokens
    torch.manual_seed(0)
    case = sys.argv[1]
    if case == "gpt":
        model, batches = TinyGPT(), tokens(3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    elif case == "resnet":
        model, batches = ResNetish(), images(3)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:  # traced furthest into the collector: this one crashed
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        batches = [(torch.randn(2, 4), torch.randint(0, 3, (2,))) for _ in range(3)]
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
    late = sys.argv[2] == "late"  # torch.compile comes into use after the first step
    step = None if late else torch.compile(lambda: opt.step(), backend="eager")
    c = HistoryCollector(model, streams=ALL_STREAMS, cadence=1,
                         settings=WatchSettings(update_sample_size=1 << 20))
    params = list(model.parameters())
    got, want = [], []
    for i, (x, y) in enumerate(batches):
        with c.step(opt, examples=len(x)):
            if late and i == 1:
                step = torch.compile(lambda: opt.step(), backend="eager")
            opt.zero_grad()
            ce(model(x), y).backward()
            grads = [p.grad.double().pow(2).sum().item() for p in params]
            before = [p.detach().double().clone() for p in params]
            step() if step is not None else opt.step()
        want.append({"gradient": grads,
                     "update": [(p.detach().double() - b).pow(2).sum().item()
                                for p, b in zip(params, before)],
                     "parameter": [p.detach().double().pow(2).sum().item() for p in params]})
        got.append({b.stream.value: b.spines[:, 11].tolist() for b in c.last_batches
                    if b.stream.value in ("gradient", "update", "parameter")})
    c.close()
    print(json.dumps({"got": got, "want": want}))
    """
)


@pytest.mark.parametrize(
    "case, when", [("mlp", "early"), ("mlp", "late"), ("gpt", "early"), ("resnet", "early")]
)
def test_a_compiled_optimizer_step_records_true_rows_and_does_not_crash(case, when):
    """The step hooks used to be traced with the step: the native kernel was handed fake
    tensors and the process died (SIGSEGV). They now run eagerly, around the compiled step.
    A child process: a crash is a failed test, not a dead test session."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILED_STEP, case, when],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=ROOT,
    )  # a hang fails, load does not
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out["got"]) == 3
    for got, want in zip(out["got"], out["want"]):
        for stream in ("gradient", "parameter"):
            np.testing.assert_allclose(got[stream], want[stream], rtol=1e-9)
        np.testing.assert_allclose(got["update"], want["update"], rtol=1e-6)  # f32 difference

"""The model's own pre/post hooks rest on quiet steps, and what a run stores does not change.

Each case runs in a fresh interpreter: the hooks rest only while ``torch.compile`` never
converted a frame in the process (:func:`stepscope.collect.activations.compiled_frames`), which
the rest of the suite's compiled tests would already have done. The cases: a plain run and a
GPT-like decoder with variable length and two optimizers (hooks off on quiet steps, back on due
steps; every stored row equal to a run with resting off), a
model compiled on a quiet step while they rest (due steps then read ``unsupported``:
``torch_compile``, never ``site_absent``), and a model with a pre-hook of its own (they never
rest: torch calls it on its hooked path anyway).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    import stepscope as ss
    from stepscope.collect import Cadence, HistoryCollector, WatchSettings
    from stepscope.collect.activations import compiled_frames

    case, out_dir = sys.argv[1], sys.argv[2]

    def run(path, rest_root=True):
        torch.manual_seed(0)
        if case == "gpt":  # variable sequence length, tied embeddings, two optimizers
            from tests.collect.models import LENGTHS, TinyGPT
            model = TinyGPT()
            params = list(model.parameters())
            opts = [torch.optim.AdamW(params[: len(params) // 2], lr=1e-2),
                    torch.optim.SGD(params[len(params) // 2 :], lr=0.1, momentum=0.9)]
        else:
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                        torch.nn.Linear(8, 2))
            opts = [torch.optim.SGD(model.parameters(), lr=0.1)]
        if case == "own_hook":
            model.register_forward_pre_hook(lambda m, a: None)
        c = HistoryCollector(model, cadence=Cadence(3, 6),
                             settings=WatchSettings(output_dir=path))
        c._sites.rest_root = rest_root
        hooks, presence, frames, compiled = {}, {}, {}, None
        g = torch.Generator().manual_seed(1)
        for step in range(7):
            if case == "compile" and step == 2:  # a quiet step: the hooks rest
                frames["before"] = compiled_frames()
                compiled = torch.compile(model, backend="eager")
            with c.step(opts, examples=5) as txn:
                hooks[step] = [len(model._forward_pre_hooks), len(model._forward_hooks)]
                if case == "gpt":
                    t = LENGTHS[step % len(LENGTHS)]
                    x = torch.randint(0, 40, (3, t), generator=g)
                    out = model(x)
                    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                             x.roll(-1, 1).reshape(-1))
                else:
                    loss = (compiled or model)(torch.randn(5, 4, generator=g)).pow(2).mean()
                for opt in opts:
                    opt.zero_grad()
                loss.backward()
                for opt in opts:
                    opt.step()
                txn.log("loss", loss.detach())
            for b in c.last_batches:
                if b.stream.value == "activation":
                    presence[step] = [p for p in b.presence.tolist()]
        c.close()
        return hooks, presence, frames

    hooks, presence, frames = run(out_dir + "/rest")
    stored = {}
    if case in ("plain", "gpt"):
        run(out_dir + "/norest", rest_root=False)
        for name in ("rest", "norest"):
            h = ss.open_run(out_dir + "/" + name)
            steps = h.table("steps").copy()
            steps["wall_time"] = 0.0
            sc = h.table("scalars")
            loss = sc[sc["name"] == list(h.scalar_names).index("loss")]
            stored[name] = [h.table(t).tobytes().hex() for t in ("observations", "histograms")]
            stored[name] += [steps.tobytes().hex(), loss.tobytes().hex()]
    print(json.dumps({"hooks": hooks, "presence": presence, "frames": frames,
                      "same": stored.get("rest") == stored.get("norest")}))
    """
)


def _child(case: str, tmp_path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, case, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _codes(*names: str) -> list[int]:
    from stepscope.history import Presence
    from stepscope.history.batch import code_of

    return [code_of(Presence(n)) for n in names]


@pytest.mark.parametrize("case", ["plain", "gpt"])
def test_the_models_own_hooks_rest_on_quiet_steps_and_the_run_stores_the_same(tmp_path, case):
    """An MLP, and a GPT-like decoder with variable sequence length stepped by two optimizers;
    histograms every 6 steps."""
    out = _child(case, tmp_path)
    hooks = {int(k): v for k, v in out["hooks"].items()}
    assert all(hooks[s] == [1, 1] for s in (0, 3, 6))  # due steps: on
    assert all(hooks[s] == [0, 0] for s in (1, 2, 4, 5))  # quiet steps: resting
    assert out["same"]  # observations, histograms, step blocks, the logged loss: byte for byte
    observed = _codes("observed")
    for s in (0, 3, 6):
        assert out["presence"][str(s)] and set(out["presence"][str(s)]) <= set(
            _codes("observed", "site_absent")
        )
    if case == "plain":
        assert all(out["presence"][str(s)] == observed * 3 for s in (0, 3, 6))


def test_a_model_compiled_while_they_rest_reads_torch_compile_never_absent(tmp_path):
    out = _child("compile", tmp_path)
    hooks = {int(k): v for k, v in out["hooks"].items()}
    assert out["frames"]["before"] == 0 and hooks[2] == [0, 0]  # compiled while they rested
    assert all(hooks[s] == [1, 1] for s in (3, 4, 5, 6))  # on from then on
    assert out["presence"]["0"] == _codes("observed") * 3
    assert out["presence"]["3"] == out["presence"]["6"] == _codes("unsupported") * 3


def test_a_model_with_hooks_of_its_own_keeps_the_collectors(tmp_path):
    out = _child("own_hook", tmp_path)
    assert all(v == [2, 1] for v in out["hooks"].values())  # the user's pre-hook and ours

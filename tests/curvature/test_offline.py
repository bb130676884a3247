"""Checkpoint panels: completion, incremental persistence, duplicates, tamper guards, censoring."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import stepscope as ss
from stepscope.cli import main
from stepscope.curvature.offline import make_panel_pins, run_curvature_panel

EPOCHS = [0, 1, 5, 10, 20, 50, 100]
MODEL_SOURCE = """
import torch
from torch import nn


def make_model():
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
"""


@pytest.fixture
def panel(tmp_path: Path):
    src = tmp_path / "panel_model.py"
    src.write_text(MODEL_SOURCE)
    spec = importlib.util.spec_from_file_location("panel_model", src)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.make_model()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    ckpts = {}
    for epoch in EPOCHS:  # one SGD step between checkpoints keeps the fixture fast
        path = tmp_path / f"ckpt-{epoch:03d}.pt"
        torch.save(model.state_dict(), path)
        ckpts[epoch] = path
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    probe = tmp_path / "probe.pt"
    torch.save({"x": x, "y": y}, probe)
    pins = make_panel_pins([src], ckpts, probe)
    return {
        "factory": module.make_model,
        "src": src,
        "ckpts": ckpts,
        "probe": probe,
        "pins": pins,
        "x": x,
        "y": y,
        "tmp": tmp_path,
    }


def test_panel_completes_and_persists_after_every_checkpoint(panel):
    out = panel["tmp"] / "out"
    seen = []

    def callback(epoch, path, aggregate):
        on_disk = json.loads((out / "result.json").read_text())
        seen.append((epoch, path.name, [c["epoch"] for c in on_disk["completed"]]))

    result = run_curvature_panel(
        panel["factory"],
        panel["ckpts"],
        panel["probe"],
        out,
        panel["pins"],
        progress_callback=callback,
    )
    assert result["status"] == "complete" and result["censored"] is None
    assert [s[0] for s in seen] == EPOCHS
    for i, (epoch, name, done) in enumerate(seen):
        assert name == f"curvature-{epoch:03d}.json" and done == EPOCHS[: i + 1]
    doc = json.loads((out / "curvature-010.json").read_text())
    model = panel["factory"]()
    model.load_state_dict(torch.load(panel["ckpts"][10], weights_only=True))
    direct = ss.analyze_curvature(model, panel["x"], panel["y"])
    assert doc["analysis"]["layers"] == direct["layers"]  # the panel reports the real analysis
    assert doc["analysis"]["metadata"]["probe_sha256"] == panel["pins"]["probe_sha256"]
    assert json.loads((out / "result.json").read_text())["status"] == "complete"
    assert not list(out.glob(".*.tmp"))


def test_duplicate_run_into_the_same_output_refuses(panel):
    out = panel["tmp"] / "out"
    run_curvature_panel(
        panel["factory"], {0: panel["ckpts"][0]}, panel["probe"], out, panel["pins"]
    )
    with pytest.raises(ss.Refusal) as err:
        run_curvature_panel(
            panel["factory"], {0: panel["ckpts"][0]}, panel["probe"], out, panel["pins"]
        )
    assert err.value.code == "panel_output_exists"


@pytest.mark.parametrize("target", ["source", "checkpoint", "probe"])
def test_tampered_inputs_refuse_before_any_output(panel, target):
    if target == "source":
        panel["src"].write_text(MODEL_SOURCE + "\n# edited\n")
    elif target == "checkpoint":
        state = torch.load(panel["ckpts"][5], weights_only=True)
        state["0.bias"] += 1e-6
        torch.save(state, panel["ckpts"][5])
    else:
        torch.save({"x": panel["x"] + 1e-7, "y": panel["y"]}, panel["probe"])
    out = panel["tmp"] / "out"
    with pytest.raises(ss.Refusal) as err:
        run_curvature_panel(panel["factory"], panel["ckpts"], panel["probe"], out, panel["pins"])
    assert err.value.code == "checkpoint_tampered" and err.value.remedies
    assert not out.exists()


def test_checkpoint_changed_mid_run_refuses(panel):
    out = panel["tmp"] / "out"

    def callback(epoch, path, aggregate):
        if epoch == 1:
            panel["ckpts"][5].write_bytes(panel["ckpts"][5].read_bytes() + b"\0")

    with pytest.raises(ss.Refusal) as err:
        run_curvature_panel(
            panel["factory"],
            panel["ckpts"],
            panel["probe"],
            out,
            panel["pins"],
            progress_callback=callback,
        )
    assert err.value.code == "checkpoint_tampered"
    done = json.loads((out / "result.json").read_text())["completed"]
    assert [c["epoch"] for c in done] == [0, 1]  # what finished stays on disk


def test_budget_censoring_stops_explicitly_without_changing_the_analysis(panel):
    now = [0.0]

    def factory():
        now[0] += 100.0  # each snapshot "takes" 100 s on the injected clock
        return panel["factory"]()

    out = panel["tmp"] / "out"
    # the wrapper factory is defined here, so this file is pinned too (an unpinned factory refuses)
    pins = make_panel_pins([panel["src"], Path(__file__)], panel["ckpts"], panel["probe"])
    result = run_curvature_panel(
        factory,
        panel["ckpts"],
        panel["probe"],
        out,
        pins,
        work_limit_s=420.0,
        clock=lambda: now[0],
    )
    # before epoch 10: 300 + 1.25 * 100 + 5 = 430 > 420
    assert result["status"] == "budget_censored"
    c = result["censored"]
    assert c["code"] == "budget_censored" and c["projected_s"] == pytest.approx(430.0)
    assert c["epochs_not_run"] == [10, 20, 50, 100]
    assert [d["epoch"] for d in result["completed"]] == [0, 1, 5]
    assert sorted(p.name for p in out.glob("curvature-*.json")) == [
        "curvature-000.json",
        "curvature-001.json",
        "curvature-005.json",
    ]
    doc = json.loads((out / "curvature-005.json").read_text())
    assert doc["analysis"]["metadata"]["mode"] == "exact"
    assert doc["analysis"]["metadata"]["analysis_dtype"] == "float64"
    assert json.loads((out / "result.json").read_text())["status"] == "budget_censored"


def test_cli_pins_runs_and_refuses_a_rerun(panel, capsys, monkeypatch):
    monkeypatch.chdir(panel["tmp"])
    pins = panel["tmp"] / "pins.json"
    ck = [f"{e}={panel['ckpts'][e]}" for e in (0, 1)]
    args = [
        "curvature-pin",
        "--source",
        str(panel["src"]),
        "--probe",
        str(panel["probe"]),
        "--out",
        str(pins),
    ]
    ck_args = [part for c in ck for part in ("--checkpoint", c)]
    assert main([*args, *ck_args]) == 0
    run = [
        "curvature",
        "--model",
        f"{panel['src']}:make_model",
        "--probe",
        str(panel["probe"]),
        "--pins",
        str(pins),
        "--out",
        "panel-out",
        *ck_args,
    ]
    assert main(run) == 0
    assert (panel["tmp"] / "panel-out" / "curvature-001.json").exists()
    assert main(run) == 3
    assert "panel_output_exists" in capsys.readouterr().err


def test_hessian_extras_are_recorded_when_requested(panel):
    pytest.importorskip("stepscope.curvature.eigen")
    pytest.importorskip("stepscope.curvature.estimators")
    out = panel["tmp"] / "out"
    run_curvature_panel(
        panel["factory"],
        {0: panel["ckpts"][0]},
        panel["probe"],
        out,
        panel["pins"],
        hessian_top_k=2,
        trace_samples=8,
    )
    doc = json.loads((out / "curvature-000.json").read_text())
    top = doc["hessian_top_eigenvalues"]
    assert len(top["values"]) == 2 and top["estimated"] is True
    est = doc["hessian_trace_estimate"]
    assert est["samples"] == 8 and est["estimated"] is True
    # cross-check against a dense float64 Hessian of the mean CE on the probe
    model = panel["factory"]()
    model.load_state_dict(torch.load(panel["ckpts"][0], weights_only=True))
    model = model.double()
    params = dict(model.named_parameters())
    names = list(params)

    def loss(*flat):
        p = dict(zip(names, flat))
        logits = torch.func.functional_call(model, p, (panel["x"].double(),))
        return torch.nn.functional.cross_entropy(logits, panel["y"])

    hess = torch.autograd.functional.hessian(loss, tuple(params[k].detach() for k in names))
    sizes = [params[k].numel() for k in names]
    rows = [
        torch.cat([hess[i][j].reshape(sizes[i], sizes[j]) for j in range(len(names))], 1)
        for i in range(len(names))
    ]
    eigs = torch.linalg.eigvalsh(torch.cat(rows, 0))
    assert top["values"][0] == pytest.approx(eigs.max().item(), rel=1e-4)


def test_npz_probe_loads_without_pickle_and_pins_the_same_bytes(panel):
    import numpy as np

    from stepscope.curvature.offline import load_probe

    path = panel["tmp"] / "probe.npz"
    np.savez(path, x=panel["x"].numpy(), y=panel["y"].numpy())
    x, y = load_probe(path)
    assert torch.equal(x, panel["x"]) and torch.equal(y, panel["y"])
    pins = make_panel_pins([panel["src"]], {0: panel["ckpts"][0]}, path)
    assert pins["probe_sha256"] == panel["pins"]["probe_sha256"]
    bad = panel["tmp"] / "bad.pt"
    torch.save({"inputs": panel["x"]}, bad)
    with pytest.raises(ss.Refusal) as err:
        load_probe(bad)
    assert err.value.code == "curvature_input_invalid"

"""The panel's source pin binds the code it runs; code version and analysis hash are recorded;
the recorder's probe identity is checked against the probe analysed."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import stepscope
from stepscope import Refusal
from stepscope.cli import main
from stepscope.curvature.offline import make_panel_pins, run_curvature_panel

SOURCE = """
from torch import nn


def make_model(width=6):
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))
"""


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def panel(tmp_path: Path):
    torch.set_num_threads(1)
    src = tmp_path / "pinned_model.py"
    src.write_text(SOURCE)
    module = _load(src, "pinned_model")
    torch.manual_seed(0)
    ckpt = tmp_path / "ckpt-000.pt"
    torch.save(module.make_model().state_dict(), ckpt)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    probe = tmp_path / "probe.pt"
    torch.save({"x": x, "y": y}, probe)
    pins = make_panel_pins([src], {0: ckpt}, probe)
    return {
        "module": module,
        "src": src,
        "ckpt": ckpt,
        "probe": probe,
        "pins": pins,
        "x": x,
        "y": y,
    }


def test_a_factory_from_an_unpinned_file_is_refused_before_it_runs(panel, tmp_path):
    other = tmp_path / "other_model.py"
    other.write_text(SOURCE)  # identical architecture, but not the pinned file
    factory = _load(other, "other_model").make_model
    out = tmp_path / "out"
    with pytest.raises(Refusal) as err:
        run_curvature_panel(factory, {0: panel["ckpt"]}, panel["probe"], out, panel["pins"])
    assert err.value.code == "curvature_source_unpinned"
    assert not out.exists()


def test_a_partial_of_the_pinned_factory_runs_and_records_its_source(panel, tmp_path):
    factory = functools.partial(panel["module"].make_model, width=6)
    out = tmp_path / "out"
    result = run_curvature_panel(factory, {0: panel["ckpt"]}, panel["probe"], out, panel["pins"])
    assert result["pins"]["verified"] is True
    assert Path(result["pins"]["factory_source"]) == panel["src"].resolve()


def test_code_version_and_analysis_hash_are_recorded(panel, tmp_path):
    out = tmp_path / "out"
    run_curvature_panel(
        panel["module"].make_model, {0: panel["ckpt"]}, panel["probe"], out, panel["pins"]
    )
    code = json.loads((out / "result.json").read_text())["code"]
    assert code["stepscope_version"] == stepscope.__version__
    analyze = Path(stepscope.curvature.analyze.__file__)
    assert code["analysis_sha256"]["analyze.py"] == hashlib.sha256(analyze.read_bytes()).hexdigest()
    doc = json.loads((out / "curvature-000.json").read_text())
    assert doc["code"] == code


def test_cli_refuses_a_tampered_source_before_executing_it(panel, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(panel["pins"]))
    marker = tmp_path / "executed.txt"
    panel["src"].write_text(SOURCE + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    code = main(
        [
            "curvature",
            "--model",
            f"{panel['src']}:make_model",
            "--checkpoint",
            f"0={panel['ckpt']}",
            "--probe",
            str(panel["probe"]),
            "--pins",
            str(pins),
            "--out",
            "out",
        ]
    )
    assert code == 3
    assert "checkpoint_tampered" in capsys.readouterr().err
    assert not marker.exists()  # the tampered file was never executed


def test_cli_refuses_a_module_factory_whose_file_is_not_pinned(
    panel, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "unpinned_mod.py").write_text(SOURCE)
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps(panel["pins"]))
    code = main(
        [
            "curvature",
            "--model",
            "unpinned_mod:make_model",
            "--checkpoint",
            f"0={panel['ckpt']}",
            "--probe",
            str(panel["probe"]),
            "--pins",
            str(pins),
            "--out",
            "out",
        ]
    )
    assert code == 3 and "curvature_source_unpinned" in capsys.readouterr().err


def test_the_recorders_probe_identity_is_checked_against_the_probe(panel, tmp_path):
    from stepscope.history import HistoryWriter
    from stepscope.probe import DenseProbe, read_probe_identity, write_probe_record

    model = panel["module"].make_model()
    probe = DenseProbe(panel["x"], panel["y"], indices=range(8), input_normalization="raw")
    run = tmp_path / "run"
    with HistoryWriter(run, durable=False) as w:
        write_probe_record(w, probe.measure(model, step=0, examples_seen=0, epoch=0))
    identity = read_probe_identity(run)
    assert identity["count"] == 8 and identity["indices"] == list(range(8))
    assert identity["dtype"] == "float32" and identity["input_normalization"] == "raw"
    ok = run_curvature_panel(
        panel["module"].make_model,
        {0: panel["ckpt"]},
        panel["probe"],
        tmp_path / "ok",
        panel["pins"],
        recorder_probe=identity,
    )
    assert ok["pins"]["recorder_probe_sha256"] == identity["sha256"]
    other = dict(identity, sha256="0" * 64)
    with pytest.raises(Refusal) as err:
        run_curvature_panel(
            panel["module"].make_model,
            {0: panel["ckpt"]},
            panel["probe"],
            tmp_path / "bad",
            panel["pins"],
            recorder_probe=other,
        )
    assert err.value.code == "checkpoint_tampered"
    assert not (tmp_path / "bad").exists()

"""Test kit for the report: artifacts, made by short real training runs through ``HistoryCollector``.

Besides the artifact, each run keeps an *independent* record of what the report should show,
computed here from the tensors themselves (own hooks, own norms), never read back from the
artifact: the tests compare the arrays the plots were given with these.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import stepscope as ss
from stepscope.collect import Cadence
from stepscope.probe import write_probe_record

STEPS = 6
PROBE_STEPS = (0, 2, 5)
EVAL_LOSS_STEPS = (0, 2, 5)
EVAL_ACC_STEPS = (0, 5)  # accuracy deliberately missing at step 2: must be a gap
TEST_STEPS = (2, 5)  # official test evaluated twice, declared an endpoint only at step 5


@dataclass
class Truth:
    """What each step really held, computed independently of stepscope's reductions."""

    grad_l2: dict[str, dict[int, float]] = field(default_factory=dict)
    param_l2: dict[str, dict[int, float]] = field(default_factory=dict)
    update_ratio: dict[str, dict[int, float]] = field(default_factory=dict)
    act_zero: dict[str, dict[int, float]] = field(default_factory=dict)
    grad_zero: dict[str, dict[int, float]] = field(default_factory=dict)
    probe: dict[int, dict[str, float]] = field(default_factory=dict)
    confusion: dict[int, list[list[int]]] = field(default_factory=dict)
    predicted: dict[int, list[int]] = field(default_factory=dict)
    eval_loss: dict[int, float] = field(default_factory=dict)
    eval_acc: dict[int, float] = field(default_factory=dict)
    active_fraction: dict[int, float] = field(default_factory=dict)
    skipped_macs: dict[int, float] = field(default_factory=dict)
    curvature: list[dict] = field(default_factory=list)


def _put(table: dict, key: str, step: int, value: float) -> None:
    table.setdefault(key, {})[step] = float(value)


def train_run(path: Path, seed: int, probe: bool = True, curvature: bool = True) -> Truth:
    """A 6-step MLP run with every stream, probe rows, eval rows, clocks and branch rows."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    x, y = torch.randn(48, 6), torch.randint(0, 3, (48,))
    vx, vy = torch.randn(32, 6), torch.randint(0, 3, (32,))
    truth = Truth()
    streams = ("activation", "gradient", "parameter", "update", "activation_grad")
    cadence = {s: Cadence(1, 2) for s in streams}
    cadence["parameter"] = Cadence(2, 2)  # parameters only at even steps: odd steps are gaps
    c = ss.HistoryCollector(
        model,
        streams=streams,
        cadence=cadence,
        settings=ss.WatchSettings(output_dir=str(path), extra={"seed": seed}),
    )
    relu_out: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda mod, i, o, n=n: relu_out.__setitem__(n, o))
        for n, m in model.named_children()
    ]
    dense = ss.DenseProbe(x, y, size=16, seed=seed) if probe else None
    if dense is not None:
        dense.snapshot_init(model)
    try:
        for step in range(STEPS):
            with c.step(opt, examples=48, epoch=0) as st:
                outs = {}
                logits = model(x)
                for n, o in relu_out.items():
                    o.retain_grad()
                    outs[n] = o
                loss = F.cross_entropy(logits, y)
                opt.zero_grad()
                loss.backward()
                before = {n: p.detach().clone() for n, p in model.named_parameters()}
                for n, p in model.named_parameters():
                    _put(truth.grad_l2, n, step, p.grad.double().norm())
                for n, o in outs.items():
                    _put(truth.act_zero, n, step, (o == 0).double().mean())
                    _put(truth.grad_zero, n, step, (o.grad == 0).double().mean())
                opt.step()
                for n, p in model.named_parameters():
                    if step % 2 == 0:
                        _put(truth.param_l2, n, step, p.detach().double().norm())
                        delta = (p.detach().double() - before[n].double()).norm()
                        _put(truth.update_ratio, n, step, delta / p.detach().double().norm())
                st.log("loss", loss)
                active = torch.arange(4) < 4 - step % 4  # 4, 3, 2, 1, 4, 3 active units
                c.log_mask("block1", active, nominal_macs_per_unit=100.0)
                truth.active_fraction[step] = float(active.double().mean())
                truth.skipped_macs[step] = 100.0 * float((~active).sum())
                st.log("branch/block1/survival_probability", 1.0 - 0.05 * step)
                if step in EVAL_LOSS_STEPS or step in EVAL_ACC_STEPS or step in TEST_STEPS:
                    with torch.no_grad():  # by hand: a model(vx) here would be watched too
                        w0, b0, w2, b2 = (p.detach() for p in model.parameters())
                        vl = F.linear(F.relu(F.linear(vx, w0, b0)), w2, b2)
                    metrics = {}
                    if step in EVAL_LOSS_STEPS:
                        truth.eval_loss[step] = metrics["ce"] = float(F.cross_entropy(vl, vy))
                    if step in EVAL_ACC_STEPS:
                        acc = float((vl.argmax(1) == vy).double().mean())
                        truth.eval_acc[step] = metrics["accuracy_fraction"] = acc
                    if metrics:
                        c.log_eval("validation", metrics, sample_count=32)
                    if step in TEST_STEPS:  # official test: only the endpoint may be plotted
                        c.log_eval("test", {"ce": 9.0 + step}, endpoint=step == TEST_STEPS[-1])
            if dense is not None and step in PROBE_STEPS:
                rec = dense.measure(model, step=step, examples_seen=48 * (step + 1), epoch=0)
                truth.probe[step] = {k: v for k, v in rec.scalars().items() if v is not None}
                truth.confusion[step] = [list(map(int, r)) for r in rec.model.confusion]
                truth.predicted[step] = list(map(int, rec.model.predicted_counts))
                write_probe_record(c.writer, rec)
    finally:
        for h in hooks:
            h.remove()
        c.close()
    if curvature:
        truth.curvature = write_curvature(path)
    return truth


def curvature_doc(epoch: int, scale: float) -> dict:
    """A panel JSON in the layout of ``run_curvature_panel`` with values chosen here."""
    fams = ("empirical_fisher", "ce_ggn", "jacobian_gram")
    layer = {"activation_factor": {"eigenvalues": [4.0 * scale, 2.0 * scale, 0.5, 0.0]}}
    for k, fam in enumerate(fams):
        layer[fam] = {
            "kfac": {
                "top_eigenvalue": scale * (k + 1),
                "effective_rank": 2.5,
                "stable_rank": 1.5,
                "relative_diagonal_error": 0.1,
            },
            "backprop_factor": {"eigenvalues": [scale * (k + 1), 0.25]},
        }
    quotient = {fam: {"mean_gradient_rayleigh_quotient": 0.5 * scale} for fam in fams}
    quotient["jacobian_gram"]["mean_gradient_rayleigh_quotient"] = None if epoch else 0.7
    return {
        "schema": "stepscope.curvature_panel.v1",
        "epoch": epoch,
        "snapshot_duration_s": 1.25,
        "analysis": {
            "metadata": {"mode": "exact", "analysis_dtype": "float64", "estimators": {}},
            "layers": {"0": layer},
            "directional": {"0": quotient},
            "output_space": {
                "support": {"rank": 2},
                "lyapunov": {"rho_ambient": 3.0 * scale, "rho_support": 2.0 * scale},
                "lyapunov_to_preconditioned_intrinsic_dimension_ratio": 1.0,
                "solution_residual": 1e-15,
                "discarded_fisher_fraction": 0.0,
            },
        },
    }


def write_curvature(path: Path) -> list[dict]:
    """Two checkpoints (epochs 0 and 5) in ``RUN/curvature/``."""
    docs = [curvature_doc(0, 1.0), curvature_doc(5, 2.0)]
    (path / "curvature").mkdir(exist_ok=True)
    for d in docs:
        (path / "curvature" / f"curvature-{d['epoch']:03d}.json").write_text(json.dumps(d))
    return docs


def bare_run(path: Path) -> None:
    """Activations only: no probe, no eval, no clocks, no curvature."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ss.HistoryCollector(
        model, streams=("activation",), settings=ss.WatchSettings(output_dir=str(path))
    ) as c:
        for _ in range(3):
            with c.step(opt, examples=8):
                loss = model(torch.randn(8, 4)).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
    (path / "runlog.json").unlink()  # as an older run without the clocks' summary


def bare_copy(runs: dict[str, object], tmp_path: Path) -> Path:
    """A private copy of the session's bare run (a test may add curvature files to it)."""
    return Path(shutil.copytree(str(runs["bare"]), tmp_path / "bare"))


def with_recipe(run: ss.run.Run, recipe: str) -> ss.run.Run:
    """``run`` opened again as if its run record named ``recipe`` (the report's seed group)."""
    other = ss.open_run(run.path)
    other.run = replace(other.run, extra={**other.run.extra, "recipe": recipe})
    return other


def as_array(d: dict[int, float], steps: np.ndarray) -> np.ndarray:
    """``{step: value}`` aligned on ``steps`` (NaN where absent)."""
    return np.array([d.get(int(s), np.nan) for s in steps])


def plots_titled(section, prefix: str) -> list:
    """Plots of a section whose title starts with ``prefix``."""
    from stepscope.report import Plot

    items = section.all_items  # the open summary, then the folded details
    return [i for i in items if isinstance(i, Plot) and i.title.startswith(prefix)]


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # PNG colour type -> samples per pixel


def decode_png(data: bytes) -> tuple[int, int]:
    """Check signature, every chunk CRC and that IDAT inflates to the size IHDR implies.

    Returns ``(width, height)``. No matplotlib/PIL: an independent reading of the format.
    """
    assert data[:8] == PNG_SIGNATURE
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, colour = struct.unpack(">IIBB", chunks[0][1][:10])
    assert width > 0 and height > 0 and depth in (1, 2, 4, 8, 16)
    if colour == 3:  # a palette image carries its palette
        assert any(kind == b"PLTE" for kind, _ in chunks)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    row = -(-width * CHANNELS[colour] * depth // 8)  # bytes per row, rounded up
    assert len(raw) == height * (1 + row)
    return width, height

"""The curvature panel: offline ``curvature-{epoch:03d}.json`` files found next to a run.

Looked for in ``RUN/curvature/`` and ``RUN/`` itself (the layout written by
:func:`stepscope.curvature.run_curvature_panel`). Per checkpoint: factor spectra (activation and
each family's backprop factor), ranks, the directional Rayleigh quotients and the output-space
Lyapunov mismatch, with the approximation (mode, estimators) and overhead (snapshot duration)
stated. These are offline checkpoint diagnostics, never conflated with the probe's moments.

Example
-------
>>> import tempfile
>>> from pathlib import Path
>>> run = Path(tempfile.mkdtemp())
>>> (run / "curvature").mkdir()
>>> _ = (run / "curvature" / "curvature-000.json").write_text("{}")
>>> [p.name for p in find_curvature_files(run)]
['curvature-000.json']
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.files import read_regular  # regular file, bounded, no link followed
from stepscope.report import data as D
from stepscope.report.model import (
    Section,
    Table,
    fmt,
    left_out_note,
    no_data,
    one_per_recipe,
    run_label,
)
from stepscope.report.plots import Trace, line_plot
from stepscope.run import Run

FAMILIES = ("empirical_fisher", "ce_ggn", "jacobian_gram")
_NAME = re.compile(r"^curvature-(\d+)\.json$")


def find_curvature_files(run_dir: Path) -> list[Path]:
    """``curvature-NNN.json`` files in ``run_dir/curvature`` and ``run_dir``, by epoch."""
    found: dict[str, Path] = {}
    for folder in (run_dir / "curvature", run_dir):
        if folder.is_dir():
            for p in folder.iterdir():
                if _NAME.match(p.name) and p.name not in found:
                    found[p.name] = p
    return [found[k] for k in sorted(found, key=_epoch_of)]


def _epoch_of(name: str) -> int:
    m = _NAME.match(name)
    return int(m[1]) if m else -1


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read one curvature JSON; refuses ``report_input_invalid`` if it is not a panel file."""
    try:
        doc = json.loads(read_regular(path, "curvature panel", max_bytes=64 << 20).decode())
    except (OSError, ValueError, RecursionError) as exc:
        raise Refusal(
            "report_input_invalid",
            f"{path} is not readable JSON ({exc}).",
            ["remove or restore the file", "rerun `stepscope curvature`"],
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("analysis"), dict):
        raise Refusal(
            "report_input_invalid",
            f"{path} has no 'analysis' block of a curvature panel.",
            ["pass files written by stepscope.curvature.run_curvature_panel"],
        )
    if "epoch" not in doc:
        doc["epoch"] = _epoch_of(path.name)
    problem = _panel_problem(doc)
    if problem is not None:
        raise Refusal(
            "report_input_invalid",
            f"{path} is not a well-formed curvature panel: {problem}.",
            ["remove or restore the file", "rerun `stepscope curvature`"],
        )
    return doc


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt_obj(v: Any) -> bool:
    return v is None or isinstance(v, dict)


def _eigenvalues(entry: Any) -> bool:
    ev = entry.get("eigenvalues") if isinstance(entry, dict) else None
    return isinstance(ev, list) and all(_real(x) for x in ev)


def _panel_problem(doc: dict[str, Any]) -> str | None:
    """What is malformed in a panel document (every field the panel reads), else ``None``."""
    if isinstance(doc["epoch"], bool) or not isinstance(doc["epoch"], int) or doc["epoch"] < 0:
        return "epoch is not an int >= 0"
    if not (doc.get("snapshot_duration_s") is None or _real(doc["snapshot_duration_s"])):
        return "snapshot_duration_s is not a number"
    a = doc["analysis"]
    meta = a.get("metadata", {})
    if not isinstance(meta, dict) or not isinstance(meta.get("estimators", {}), dict):
        return "analysis.metadata is not an object with an estimators object"
    layers = a.get("layers")
    if not isinstance(layers, dict):
        return "analysis.layers is not an object"
    for name, entry in layers.items():
        if not isinstance(entry, dict) or not _eigenvalues(entry.get("activation_factor")):
            return f"layer {name!r} lacks activation_factor eigenvalues (numbers)"
        for fam in FAMILIES:
            f = entry.get(fam)
            if not isinstance(f, dict) or not _eigenvalues(f.get("backprop_factor")):
                return f"layer {name!r} lacks {fam} backprop_factor eigenvalues (numbers)"
            k = f.get("kfac")
            if not isinstance(k, dict) or not all(
                k.get(x) is None or _real(k.get(x))
                for x in (
                    "top_eigenvalue",
                    "effective_rank",
                    "stable_rank",
                    "relative_diagonal_error",
                )
            ):
                return f"layer {name!r} {fam} kfac is not an object of numbers"
    directional = a.get("directional")
    if not _opt_obj(directional):
        return "analysis.directional is not an object"
    for name, entry in (directional or {}).items():
        if not isinstance(entry, dict):
            return f"directional entry {name!r} is not an object"
        for fam in FAMILIES:
            q = entry.get(fam)
            quotient = (q or {}).get("mean_gradient_rayleigh_quotient") if _opt_obj(q) else None
            if not _opt_obj(q) or not (quotient is None or _real(quotient)):
                return f"directional {name!r} {fam} quotient is not a number"
    out = a.get("output_space")
    if not _opt_obj(out):
        return "analysis.output_space is not an object"
    out = out or {}
    if not _opt_obj(out.get("support")) or not _opt_obj(out.get("lyapunov")):
        return "output_space support/lyapunov are not objects"
    values = [
        (out.get("support") or {}).get("rank"),
        *((out.get("lyapunov") or {}).get(k) for k in ("rho_ambient", "rho_support")),
        *(
            out.get(k)
            for k in (
                "lyapunov_to_preconditioned_intrinsic_dimension_ratio",
                "solution_residual",
                "discarded_fisher_fraction",
            )
        ),
    ]
    if not all(v is None or _real(v) for v in values):
        return "an output_space value is not a number"
    return None


def _spectrum_traces(layers: dict[str, Any]) -> list[Trace]:
    traces = []
    for name, entry in layers.items():
        ev = np.array(entry["activation_factor"]["eigenvalues"], float)
        x = np.arange(1, len(ev) + 1.0)
        traces.append(
            Trace(f"{name} A (activation)", x, ev, group=f"layer {name}", family="A activation")
        )
        for fam in FAMILIES:
            ev = np.array(entry[fam]["backprop_factor"]["eigenvalues"], float)
            x = np.arange(1, len(ev) + 1.0)
            traces.append(Trace(f"{name} B {fam}", x, ev, group=f"layer {name}", family=f"B {fam}"))
    return traces


def _pos(values: np.ndarray) -> np.ndarray:
    return np.where(values > 0, values, np.nan)  # log axis: non-positive values are not drawn


def curvature_section(runs: list[Run], every_seed: bool = False) -> Section:
    """Spectra, ranks, directional quotients and Lyapunov mismatch per checkpoint (one run per
    recipe unless ``every_seed``). Open: each run's spectra at its last checkpoint."""
    sec = Section("curvature", "Curvature panel (offline, per checkpoint)")
    shown, left = (runs, []) if every_seed else one_per_recipe(runs)
    for r in shown:
        files = find_curvature_files(r.path)
        if not files:
            sec.items.append(
                no_data(
                    f"curvature · {run_label(r)}",
                    "RUN/curvature/curvature-*.json",
                    "run `stepscope curvature` on saved checkpoints",
                )
            )
            continue
        docs = [load_checkpoint(p) for p in files]
        ranks: list[list[str]] = []
        lyap: list[list[str]] = []
        quotient: dict[tuple[str, str], list[float]] = {}
        epochs = np.array([float(d["epoch"]) for d in docs])
        for d in docs:
            a = d["analysis"]
            meta = a.get("metadata", {})
            traces = _spectrum_traces(a["layers"])
            (sec.items if d is docs[-1] else sec.details).append(
                line_plot(
                    f"factor spectra at epoch {d['epoch']} · {run_label(r)}",
                    "eigenvalue index (descending)",
                    "eigenvalue",
                    [
                        Trace(t.label, t.x, _pos(t.y), group=t.group, family=t.family)
                        for t in traces
                    ],
                    logy=True,
                    caption=f"mode {meta.get('mode', '?')}, estimators "
                    f"{json.dumps(meta.get('estimators', {}))}, dtype "
                    f"{meta.get('analysis_dtype', '?')}; overhead: snapshot took "
                    f"{fmt(d.get('snapshot_duration_s'))} s outside training. Factor spectra only "
                    "(KFAC drops activation/derivative dependence and cross-layer structure).",
                )
            )
            for name, entry in a["layers"].items():
                for fam in FAMILIES:
                    k = entry[fam]["kfac"]
                    ranks.append(
                        [str(d["epoch"]), name, fam]
                        + [fmt(k.get(x)) for x in ("top_eigenvalue", "effective_rank")]
                        + [fmt(k.get(x)) for x in ("stable_rank", "relative_diagonal_error")]
                    )
            for name, entry in (a.get("directional") or {}).items():
                for fam in FAMILIES:
                    q = (entry.get(fam) or {}).get("mean_gradient_rayleigh_quotient")
                    quotient.setdefault((name, fam), []).append(np.nan if q is None else q)
            out = a.get("output_space") or {}
            ly = out.get("lyapunov") or {}
            lyap.append(
                [
                    str(d["epoch"]),
                    fmt((out.get("support") or {}).get("rank")),
                    fmt(ly.get("rho_ambient")),
                    fmt(ly.get("rho_support")),
                    fmt(out.get("lyapunov_to_preconditioned_intrinsic_dimension_ratio")),
                    fmt(out.get("solution_residual")),
                    fmt(out.get("discarded_fisher_fraction")),
                ]
            )
        head = ["epoch", "layer", "family", "KFAC top eig", "effective rank", "stable rank"]
        sec.details.append(
            Table(f"KFAC ranks · {run_label(r)}", [*head, "rel. diagonal error"], ranks)
        )
        if quotient:
            sec.details.append(
                line_plot(
                    f"mean-gradient KFAC Rayleigh quotient · {run_label(r)}",
                    "checkpoint epoch",
                    "q(G) / ||G||^2",
                    [
                        Trace(f"{n} {f}", epochs, np.array(v), group=f"layer {n}", family=f)
                        for (n, f), v in quotient.items()
                    ],
                    caption="Gaps: undefined (zero mean gradient), listed in the JSON metadata.",
                )
            )
        else:
            sec.details.append(no_data("directional quotients", "analysis.directional"))
        sec.details.append(precision_table(r, docs))
        head = ["epoch", "support rank", "rho ambient", "rho support", "Lyapunov/precond. ratio"]
        sec.details.append(
            Table(
                f"output-space Lyapunov mismatch · {run_label(r)}",
                [*head, "relative residual", "discarded Fisher fraction"],
                lyap,
            )
        )
    note = left_out_note("curvature panels", left)
    if note is not None and sec.has_data:
        sec.details.append(note)
    return sec


def precision_table(r: Run, docs: list[dict[str, Any]]) -> Table:
    """Recorder FP32 vs offline FP64 probe CE/accuracy, side by side per checkpoint.

    The recorder's values are its ``probe/model/*`` rows at the checkpoint's optimizer step
    (recorded by the panel as ``optimizer_step``); the panel's are its metadata
    ``probe_cross_entropy_mean`` / ``probe_accuracy_fraction``. A descriptive precision
    comparison of the same probe (sha256 shown), not a requirement of bitwise equality.
    """
    from stepscope.probe.sink import read_probe_identity  # lazy: probe.sink imports torch

    identity = read_probe_identity(r.path) or {}
    rows: list[list[str]] = []
    for d in docs:
        meta = d["analysis"].get("metadata", {})
        step = d.get("optimizer_step")
        rec_ce = rec_acc = None
        if step is not None:
            at = np.array([int(step)])
            ce = D.scalar_on(r, "probe/model/loss", at)[0]
            acc = D.scalar_on(r, "probe/model/accuracy_fraction", at)[0]
            rec_ce = None if np.isnan(ce) else float(ce)
            rec_acc = None if np.isnan(acc) else float(acc)
        off_ce, off_acc = meta.get("probe_cross_entropy_mean"), meta.get("probe_accuracy_fraction")
        diff = None if rec_ce is None or off_ce is None else rec_ce - off_ce
        same = meta.get("probe_sha256")
        rows.append(
            [
                str(d["epoch"]),
                fmt(step),
                fmt(rec_ce),
                fmt(off_ce),
                fmt(diff),
                fmt(rec_acc),
                fmt(off_acc),
                "yes" if same and same == identity.get("sha256") else "not shown to match",
            ]
        )
    head = ["epoch", "optimizer step", f"probe CE recorder ({identity.get('dtype', '?')})"]
    head += ["probe CE offline (float64)", "CE difference", "probe acc recorder"]
    head += ["probe acc offline (float64)", "same probe (sha256)"]
    return Table(f"recorder FP32 vs offline FP64 probe CE/accuracy · {run_label(r)}", head, rows)

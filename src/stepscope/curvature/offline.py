"""Checkpoint panels: ``analyze_curvature`` over pinned checkpoints, persisted after each one.

The panel verifies sha256 pins of the model source files, of every checkpoint and of the probe
before any work; each checkpoint's bytes are hashed again as they are loaded (the same bytes are
deserialised, ``torch.load(..., weights_only=True)``). The model factory itself must be defined in
a pinned source file (found with :func:`factory_source`, through ``functools.partial``), else the
panel refuses ``curvature_source_unpinned`` before the factory is called; the command line checks
the file of ``--model`` against the pins *before* importing it. Given the recorder's probe identity
(``probe.json`` of the run, :func:`stepscope.probe.read_probe_identity`), its sha256 and count must
match the probe analysed. The aggregate records stepscope's version and the sha256 of every
analysis source file (:func:`analysis_code_sha256`). After each checkpoint it writes
``curvature-{epoch:03d}.json`` and the updated aggregate ``result.json`` atomically (temp file,
fsync, ``os.replace``, directory fsync) and calls the progress callback.
The pin checks are in :mod:`stepscope.curvature.pins`.

Budget: before each checkpoint, with :math:`t` the elapsed work time and :math:`d_{\\max}` the
largest snapshot duration so far, the panel stops with status ``budget_censored`` when

.. math:: t + 1.25\\, d_{\\max} + 5\\,\\text{s} > \\text{work\\_limit\\_s}.

It never switches to sampled directions, drops checkpoints or lowers precision to fit.

Example
-------
>>> from stepscope.curvature.offline import make_panel_pins, run_curvature_panel  # needs saved checkpoints and a probe file  # doctest: +SKIP
>>> run_curvature_panel(make_model, {0: "ckpt-000.pt", 1: "ckpt-001.pt"}, "probe.pt", "out/",
...                     pins=make_panel_pins(["model.py"], {0: "ckpt-000.pt", 1: "ckpt-001.pt"},
...                                          "probe.pt"))  # needs saved checkpoints and a probe file  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from stepscope._version import __version__
from stepscope.curvature.analyze import analyze_curvature, probe_sha256
from stepscope.curvature.eigen import top_eigenvalues
from stepscope.curvature.estimators import trace
from stepscope.curvature.pins import (
    _check_recorder_probe,
    _pinned_sha256,
    _tampered,
    _verify_pins,
    analysis_code_sha256,
    factory_source,
)
from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal
from stepscope.history.files import atomic_write_json

__all__ = [
    "DEFAULT_WORK_LIMIT_S",
    "PANEL_SCHEMA",
    "SAFETY_FACTOR",
    "SAFETY_MARGIN_S",
    "ProgressCallback",
    "load_probe",
    "make_panel_pins",
    "run_curvature_panel",
]

PANEL_SCHEMA = "stepscope.curvature_panel.v1"
SAFETY_FACTOR = 1.25
SAFETY_MARGIN_S = 5.0
DEFAULT_WORK_LIMIT_S = 420.0

ProgressCallback = Callable[[int, Path, dict[str, Any]], None]


def load_probe(path: str | os.PathLike[str]) -> tuple[Tensor, Tensor]:
    """Load ``x`` and ``y`` from ``.npz`` (no pickle) or a ``torch.save`` dict (weights_only)."""
    path = Path(path)
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            return torch.from_numpy(data["x"].copy()), torch.from_numpy(data["y"].copy())
    obj = torch.load(path, weights_only=True)
    if not isinstance(obj, dict) or "x" not in obj or "y" not in obj:
        raise Refusal(
            "curvature_input_invalid",
            f"probe file {str(path)!r} must hold a dict with tensors 'x' and 'y'",
            ["torch.save({'x': x, 'y': y}, path) or numpy.savez(path, x=x, y=y)"],
        )
    return obj["x"], obj["y"]


def make_panel_pins(
    source_files: Sequence[str | os.PathLike[str]],
    checkpoints: Mapping[int, str | os.PathLike[str]],
    probe: str | os.PathLike[str] | tuple[Tensor, Tensor],
) -> dict[str, Any]:
    """Compute the pins a panel verifies (store them before the run, e.g. in ``pins.json``)."""
    x, y = load_probe(probe) if isinstance(probe, (str, os.PathLike)) else probe
    return {
        "source_sha256": {str(p): _pinned_sha256(p, "model source file") for p in source_files},
        "checkpoint_sha256": {
            str(int(e)): _pinned_sha256(p, "checkpoint") for e, p in checkpoints.items()
        },
        "probe_sha256": probe_sha256(x, y),
    }


def _load_checkpoint(path: Path, want: str, factory: Callable[[], nn.Module]) -> nn.Module:
    raw = path.read_bytes()
    got = hashlib.sha256(raw).hexdigest()
    if got != want:  # changed since the up-front check
        raise _tampered("checkpoint", path, want, got)
    state = torch.load(io.BytesIO(raw), weights_only=True)
    model = factory()
    model.load_state_dict(state, strict=True)
    return model


def _extras(
    model: nn.Module, x: Tensor, y: Tensor, hessian_top_k: int, trace_samples: int, seed: int
) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    if hessian_top_k:
        extras["hessian_top_eigenvalues"] = top_eigenvalues(
            model, x, y, k=hessian_top_k, kind="hessian", seed=seed, dtype=torch.float64
        ).to_dict()
    if trace_samples:
        extras["hessian_trace_estimate"] = trace(
            model, x, y, kind="hessian", samples=trace_samples, seed=seed, dtype=torch.float64
        ).to_dict()
    return extras


def _version() -> str:
    return __version__


def run_curvature_panel(
    model_factory: Callable[[], nn.Module],
    checkpoints: Mapping[int, str | os.PathLike[str]],
    probe: str | os.PathLike[str] | tuple[Tensor, Tensor],
    output_dir: str | os.PathLike[str],
    pins: Mapping[str, Any],
    *,
    mode: str = "exact",
    samples: int = 1,
    seed: int = DEFAULT_SEED,
    probe_id: str | None = None,
    eig_max_dimension: int = 1536,
    include_directional: bool = True,
    work_limit_s: float = DEFAULT_WORK_LIMIT_S,
    progress_callback: ProgressCallback | None = None,
    hessian_top_k: int = 0,
    trace_samples: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    recorder_probe: Mapping[str, Any] | None = None,
    checkpoint_steps: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """Run :func:`~stepscope.curvature.analyze.analyze_curvature` over a checkpoint panel.

    Parameters
    ----------
    model_factory
        Builds a fresh model; each checkpoint (a ``torch.save(state_dict)`` file) is loaded into
        it with ``strict=True``.
    checkpoints
        ``epoch -> path``; processed in increasing epoch order.
    probe
        ``(x, y)`` or a probe file (:func:`load_probe`).
    output_dir
        Must not already hold a panel (refuses ``panel_output_exists``).
    pins
        ``{"source_sha256": {path: sha}, "checkpoint_sha256": {epoch: sha}, "probe_sha256": sha}``
        (:func:`make_panel_pins`); any mismatch refuses ``checkpoint_tampered``.
    mode, samples, seed, probe_id, eig_max_dimension, include_directional
        Passed to ``analyze_curvature`` unchanged for every checkpoint.
    work_limit_s
        Work budget in seconds (see the module docstring for the stopping rule).
    progress_callback
        ``callback(epoch, json_path, aggregate)`` after each persisted checkpoint (e.g. a volume
        commit).
    hessian_top_k, trace_samples
        When non-zero, also record ``stepscope.curvature.top_eigenvalues`` (Hessian, ``k``) and
        ``stepscope.curvature.trace`` (Hessian, Hutchinson with that many samples), float64.
    clock
        Monotonic seconds (injectable for tests).
    recorder_probe
        The training run's probe identity (``probe.json``); its sha256 and count must match
        ``probe`` or the panel refuses ``checkpoint_tampered`` before any work.
    checkpoint_steps
        ``epoch -> optimizer step`` of each checkpoint, recorded per checkpoint so that the
        recorder's FP32 probe numbers at that step can be shown beside the panel's FP64 ones.

    Returns
    -------
    dict
        The final aggregate (also in ``result.json``): ``status`` is ``"complete"`` or
        ``"budget_censored"`` (with a ``censored`` record naming the epochs not run).
    """
    start = clock()
    out = Path(output_dir)
    if out.exists() and (any(out.glob("curvature-*.json")) or (out / "result.json").exists()):
        raise Refusal(
            "panel_output_exists",
            f"{str(out)!r} already holds a curvature panel",
            ["choose a new output directory", "or remove the old panel deliberately"],
        )
    for name, value in (("hessian_top_k", hessian_top_k), ("trace_samples", trace_samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Refusal("curvature_input_invalid", f"{name}={value!r}", ["pass an integer >= 0"])
    paths = {int(e): Path(p) for e, p in checkpoints.items()}
    if not paths:
        raise Refusal("curvature_input_invalid", "no checkpoints given", ["pass epoch -> path"])
    x, y = load_probe(probe) if isinstance(probe, (str, os.PathLike)) else probe
    _verify_pins(pins, paths, x, y, model_factory)
    _check_recorder_probe(recorder_probe, x, y)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_pins = {int(k): v for k, v in pins["checkpoint_sha256"].items()}
    aggregate: dict[str, Any] = {
        "schema": PANEL_SCHEMA,
        "status": "running",
        "config": {
            "mode": mode,
            "samples": samples,
            "seed": seed,
            "probe_id": probe_id,
            "eig_max_dimension": eig_max_dimension,
            "include_directional": include_directional,
            "work_limit_s": work_limit_s,
            "stop_rule": f"elapsed + {SAFETY_FACTOR} * largest_snapshot_duration + "
            f"{SAFETY_MARGIN_S} s > work_limit_s",
            "hessian_top_k": hessian_top_k,
            "trace_samples": trace_samples,
        },
        "pins": {
            "source_sha256": dict(pins["source_sha256"]),
            "checkpoint_sha256": {str(k): v for k, v in ckpt_pins.items()},
            "probe_sha256": pins["probe_sha256"],
            "factory_source": str(factory_source(model_factory)),
            "recorder_probe_sha256": None if recorder_probe is None else recorder_probe["sha256"],
            "verified": True,
        },
        "code": {"stepscope_version": _version(), "analysis_sha256": analysis_code_sha256()},
        "epochs": sorted(paths),
        "completed": [],
        "censored": None,
        "first_snapshot_projection_s": None,
    }
    atomic_write_json(out / "result.json", aggregate)
    largest = 0.0
    for epoch in sorted(paths):
        elapsed = clock() - start
        projected = elapsed + SAFETY_FACTOR * largest + SAFETY_MARGIN_S
        if projected > work_limit_s:
            done = {c["epoch"] for c in aggregate["completed"]}
            aggregate["status"] = "budget_censored"
            aggregate["censored"] = {
                "code": "budget_censored",
                "elapsed_s": elapsed,
                "largest_snapshot_duration_s": largest,
                "projected_s": projected,
                "work_limit_s": work_limit_s,
                "epochs_not_run": [e for e in sorted(paths) if e not in done],
            }
            break
        t0 = clock()
        model = _load_checkpoint(paths[epoch], ckpt_pins[epoch], model_factory)
        analysis = analyze_curvature(
            model, x, y, mode, samples, seed, probe_id, eig_max_dimension, include_directional
        )
        extras = _extras(model, x, y, hessian_top_k, trace_samples, seed)
        duration = clock() - t0
        largest = max(largest, duration)
        doc = {
            "schema": PANEL_SCHEMA,
            "epoch": epoch,
            "checkpoint": {"path": str(paths[epoch]), "sha256": ckpt_pins[epoch]},
            "optimizer_step": None if checkpoint_steps is None else checkpoint_steps.get(epoch),
            "code": aggregate["code"],
            "snapshot_duration_s": duration,
            "analysis": analysis,
            **extras,
        }
        target = out / f"curvature-{epoch:03d}.json"
        atomic_write_json(target, doc)
        if aggregate["first_snapshot_projection_s"] is None:
            aggregate["first_snapshot_projection_s"] = duration * len(paths)
        aggregate["completed"].append(
            {
                "epoch": epoch,
                "file": target.name,
                "sha256": _pinned_sha256(target, "result file"),
                "snapshot_duration_s": duration,
            }
        )
        aggregate["elapsed_s"] = clock() - start
        atomic_write_json(out / "result.json", aggregate)
        if progress_callback is not None:
            progress_callback(epoch, target, aggregate)
    if aggregate["status"] == "running":
        aggregate["status"] = "complete"
    aggregate["elapsed_s"] = clock() - start
    atomic_write_json(out / "result.json", aggregate)
    return aggregate

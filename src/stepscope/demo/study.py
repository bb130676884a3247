"""The reference study behind ``stepscope demo``: seeds x variants, every instrument on.

For each variant (``plain``, ``residual``) and seed, the Ciresan-style MLP trains on the bundled
digits with the :class:`~stepscope.HistoryCollector` on (all five streams, default cadence), the
:class:`~stepscope.DenseProbe` on the cadence its helper qualifies (<= 5% overhead for measurement
plus serialisation, measured on a copy of the model) plus each epoch's end, around predeclared
steps, validation rows (with confusion matrices) every epoch and a test row at the declared
endpoint, and checkpoints at three points that the offline curvature panel
(:func:`~stepscope.curvature.run_curvature_panel`) analyses afterwards.
Every run is one artifact directory; the report (:mod:`stepscope.report`) reads them all.

One probe serves the whole study: the same seeded draw (:data:`PROBE_SEED`) from the same fitting
split for every variant and seed, so probe curves of different runs average the same examples
(``probe.json`` in each run holds its identity). The probe's measurements, their serialisation,
the one-step update snapshots and the checkpoint writes run inside ``collector.telemetry()``: they
are charged to ``clock/telemetry_seconds`` and never to the isolated training seconds. Each run's
``telemetry.json`` states probe seconds, serialisation seconds, snapshot and checkpoint seconds,
and the overall telemetry fraction including them
(:func:`~stepscope.demo.telemetry.telemetry_record`, in :mod:`stepscope.demo.telemetry`).

Example
-------
>>> from stepscope.demo.study import StudyConfig, run_study
>>> result = run_study(StudyConfig(quick=True, out_dir="runs/demo"))  # trains the whole study (minutes)  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import torch
import torch.nn.functional as F

from stepscope.collect import ALL_STREAMS, HistoryCollector, WatchSettings
from stepscope.curvature import make_panel_pins, run_curvature_panel
from stepscope.defaults import DEFAULT_SEED
from stepscope.demo import model as model_module
from stepscope.demo.data import DigitSplits, load_digits_splits
from stepscope.demo.model import Residual, ciresan_mlp
from stepscope.demo.overlay import write_example_overlay
from stepscope.demo.run import evaluate, print_dataset_statistics
from stepscope.demo.telemetry import (
    TELEMETRY_FILE,
    TelemetryLedger,
    probe_cadence,
    probed_update,
    telemetry_record,
)
from stepscope.errors import Refusal
from stepscope.history.files import atomic_write_json
from stepscope.probe import DenseProbe, read_probe_identity, write_probe_record
from stepscope.progress import Progress
from stepscope.report import render_report
from stepscope.runlog.sink import read_summary

if TYPE_CHECKING:
    pass

#: The one probe draw of the whole study (every variant and seed probes the same examples).
PROBE_SEED = DEFAULT_SEED


@dataclass(frozen=True)
class StudyConfig:
    """What the study trains. ``quick`` shrinks it for tests (one seed, one epoch, tiny widths)."""

    out_dir: str = "runs/demo"
    seeds: tuple[int, ...] = (0, 1, 2)
    variants: tuple[str, ...] = ("plain", "residual")
    epochs: int = 4
    batch_size: int = 64
    lr: float = 0.1
    momentum: float = 0.9
    width_scale: float = 0.1
    probe_size: int = 128
    probe_every: int | None = None  # None: the probe's own <=5%-overhead cadence helper decides
    probe_overhead_target: float = 0.05
    survival: float = 0.8  # stochastic depth of the residual variant's blocks
    data_source: str = "auto"
    report: bool = True
    quick: bool = False
    overlay: str | None = "example"  # a JSON file, "example" (illustrative points) or None

    def effective(self) -> StudyConfig:
        if not self.quick:
            return self
        return StudyConfig(
            **{
                **asdict(self),
                "seeds": self.seeds[:1],
                "epochs": min(self.epochs, 2),
                "width_scale": 0.03,
                "probe_size": 64,
            }
        )

    def validate(self) -> None:
        bad = [v for v in self.variants if v not in ("plain", "residual")]
        if (
            self.epochs < 1
            or self.batch_size < 1
            or self.lr <= 0
            or not self.seeds
            or bad
            or (self.probe_every is not None and self.probe_every < 1)
        ):
            raise Refusal(
                "run_config_invalid",
                f"invalid study configuration (epochs, batch_size, lr, seeds, variants {bad}, probe_every)",
                ["use positive epochs/batch size/lr, at least one seed, variants plain/residual"],
            )


@dataclass
class RunSummary:
    """One trained run: where its artifact is and what it measured."""

    variant: str
    seed: int
    path: Path
    steps: int
    final_validation: dict[str, float]
    test: dict[str, float]
    telemetry_seconds: float
    elapsed_seconds: float
    curvature_files: list[str] = field(default_factory=list)
    telemetry: dict = field(default_factory=dict)


@dataclass
class StudyResult:
    config: StudyConfig
    runs: list[RunSummary]
    report: Path | None
    elapsed_seconds: float


def _checkpoint_epochs(epochs: int) -> list[int]:
    """Three checkpoints: initialisation, the middle, the end (fewer if there are fewer epochs)."""
    return sorted({0, (epochs + 1) // 2, epochs})


def _macs_per_example(module: torch.nn.Module) -> int:
    """Nominal multiply-accumulates of one example through ``module``'s Linear layers."""
    return sum(
        m.in_features * m.out_features for m in module.modules() if isinstance(m, torch.nn.Linear)
    )


def train_run(
    cfg: StudyConfig, splits: DigitSplits, variant: str, seed: int, stream: TextIO
) -> RunSummary:
    """Train one (variant, seed) run with every instrument on; returns its summary."""
    path = Path(cfg.out_dir) / f"{variant}-seed{seed}"
    if path.exists():
        shutil.rmtree(path)  # the demo owns its output directory: a rerun starts fresh
    torch.manual_seed(seed)
    residual = variant == "residual"

    # a partial of the pinned model file's own function: the panel checks where it is defined
    factory = functools.partial(
        ciresan_mlp,
        n_inputs=splits.n_features,
        width_scale=cfg.width_scale,
        residual=residual,
        survival=cfg.survival if residual else 1.0,
    )

    model = factory()
    branches = [
        (n, m, _macs_per_example(m)) for n, m in model.named_modules() if isinstance(m, Residual)
    ]
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    probe = DenseProbe(
        splits.train_x,
        splits.train_y,
        size=cfg.probe_size,
        seed=PROBE_SEED,  # one probe for every variant and seed
        input_normalization=splits.normalisation,
    )
    n = len(splits.train_y)
    steps_per_epoch = (n + cfg.batch_size - 1) // cfg.batch_size
    probe_every, cadence_record = probe_cadence(cfg, probe, model, splits, steps_per_epoch)
    collector = HistoryCollector(
        model,
        sites="*",
        streams=ALL_STREAMS,
        settings=WatchSettings(
            output_dir=str(path),
            run_id=f"demo-{variant}-seed{seed}",
            extra={
                "data": splits.describe(),
                "variant": variant,
                "seed": seed,
                "study": asdict(cfg),
                "probe_cadence": cadence_record,
            },
        ),
    )
    ledger = TelemetryLedger(collector)
    with ledger.charge("update_snapshot_seconds"):
        probe.snapshot_init(model)
    ckpt_dir = path / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    checkpoints: dict[int, Path] = {}
    checkpoint_steps: dict[int, int] = {}
    keep = _checkpoint_epochs(cfg.epochs)
    eval_seconds = [0.0]

    def save(epoch: int, at_step: int) -> None:
        if epoch in keep:
            checkpoints[epoch] = ckpt_dir / f"epoch-{epoch:03d}.pt"
            checkpoint_steps[epoch] = at_step
            with ledger.charge("checkpoint_seconds"):  # an offline snapshot: telemetry
                torch.save(model.state_dict(), checkpoints[epoch])

    def probe_now(at_step: int, seen: int, epoch: int) -> None:
        with ledger.charge("probe_seconds"):
            rec = probe.measure(model, step=at_step, examples_seen=seen, epoch=epoch)
        with ledger.charge("probe_serialization_seconds"):
            write_probe_record(collector, rec)  # rows, identity, and live events

    def log_validation(epoch: int) -> dict[str, float]:
        t_eval = time.perf_counter()
        metrics = evaluate(model, splits.val_x, splits.val_y, confusion=True)
        eval_seconds[0] += time.perf_counter() - t_eval
        collector.log_eval(
            "validation",
            metrics,
            sample_count=len(splits.val_y),
            data_hash=splits.split_hash,
            epoch=epoch,
        )
        return {k: v for k, v in metrics.items() if k != "confusion"}

    gen = torch.Generator().manual_seed(seed)
    t0, step, val = time.perf_counter(), 0, {}
    seen = 0  # examples consumed: what each step hands the collector as ``examples``
    try:
        save(0, 0)
        probe_now(0, 0, 0)
        log_validation(0)
        for epoch in range(cfg.epochs):
            order = torch.randperm(n, generator=gen)
            bar = Progress(
                steps_per_epoch,
                f"{variant} seed {seed} epoch {epoch + 1}/{cfg.epochs}",
                unit="step",
            )
            model.train()
            for i in range(steps_per_epoch):
                idx = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
                # predeclared probe steps: the cadence, and each epoch's last step so that probe rows
                # and validation rows share an optimizer step (the report's generalisation gap)
                probed = step % probe_every == 0 or i == steps_per_epoch - 1
                with collector.step(opt, examples=len(idx), epoch=epoch) as st:
                    loss = F.cross_entropy(model(splits.train_x[idx]), splits.train_y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    if probed:  # a predeclared step: the probe records its true update
                        probed_update(ledger, probe, model, step, opt)
                    else:
                        opt.step()
                    st.log("train/loss", loss)
                    st.log("train/lr", opt.param_groups[0]["lr"])
                    for name, block, macs in branches:  # realised depth, never "time saved"
                        collector.log_mask(
                            name,
                            torch.tensor([float(block.last_active)]),
                            nominal_macs_per_unit=float(len(idx) * macs),
                        )
                        st.log(f"branch/{name}/survival_probability", block.survival)
                step += 1
                seen += len(idx)
                if probed:  # outside the transaction, in eval mode: nothing leaks into the step
                    probe_now(step, seen, epoch)
                bar.advance(note=f"loss {float(loss.detach()):.3f}")
            val = log_validation(epoch + 1)
            save(epoch + 1, step)
        t_eval = time.perf_counter()
        test = evaluate(model, splits.test_x, splits.test_y, confusion=True)
        eval_seconds[0] += time.perf_counter() - t_eval
        collector.log_eval(
            "test",
            test,
            sample_count=len(splits.test_y),
            data_hash=splits.split_hash,
            endpoint=True,
            epoch=cfg.epochs,
        )
    finally:
        collector.close()
    elapsed = time.perf_counter() - t0
    record = telemetry_record(
        read_summary(path) or {}, dict(ledger.seconds), dict(ledger.counts), eval_seconds[0]
    )
    record["cadence_qualification"] = cadence_record

    atomic_write_json(path / TELEMETRY_FILE, record)
    x, y = probe._inputs, probe._labels
    pins = make_panel_pins([model_module.__file__], checkpoints, (x, y))
    panel = run_curvature_panel(
        factory,
        checkpoints,
        (x, y),
        path / "curvature",
        pins,
        recorder_probe=read_probe_identity(path),
        checkpoint_steps=checkpoint_steps,
    )
    files = sorted(p.name for p in (path / "curvature").glob("curvature-*.json"))
    fraction = record["overall_telemetry_fraction"]
    print(
        f"{variant} seed {seed}: {step} steps, validation accuracy "
        f"{val.get('accuracy', float('nan')):.3f}, test accuracy {test['accuracy']:.3f}; "
        f"telemetry {record['telemetry_seconds']:.2f} s (probe {record['probe_seconds']:.2f} s, "
        f"serialisation {record['probe_serialization_seconds']:.2f} s) = "
        f"{100 * (fraction or float('nan')):.1f}% of {record['training_seconds']:.2f} s training; "
        f"curvature at epochs {sorted(checkpoints)} ({panel.get('status', 'done')})",
        file=stream,
    )
    test = {k: v for k, v in test.items() if k != "confusion"}
    return RunSummary(
        variant,
        seed,
        path,
        step,
        val,
        test,
        record["telemetry_seconds"],
        elapsed,
        files,
        record,
    )


def run_study(config: StudyConfig, stream: TextIO | None = None) -> StudyResult:
    """Train every (variant, seed), run the curvature panels, render the report."""
    stream = stream or sys.stdout
    cfg = config.effective()
    cfg.validate()
    t0 = time.perf_counter()
    splits = load_digits_splits(cfg.data_source)
    print(
        f"data: {splits.source}, {len(splits.train_y)} train / {len(splits.val_y)} validation / "
        f"{len(splits.test_y)} test (split {splits.split_hash[:12]}); "
        f"{len(cfg.variants)} variants x {len(cfg.seeds)} seeds, {cfg.epochs} epochs each",
        file=stream,
    )
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    runs = [train_run(cfg, splits, v, s, stream) for v in cfg.variants for s in cfg.seeds]
    first = runs[0]
    final = ciresan_mlp(
        n_inputs=splits.n_features,
        width_scale=cfg.width_scale,
        residual=first.variant == "residual",
    )
    final.load_state_dict(
        torch.load(first.path / "checkpoints" / f"epoch-{cfg.epochs:03d}.pt", weights_only=True)
    )
    print(f"\n{first.variant} seed {first.seed}, final model:", file=stream)
    print_dataset_statistics(final, splits, stream)
    report = None
    if cfg.report:
        report = Path(cfg.out_dir) / "report.html"
        overlays: list[str] = []
        if cfg.overlay == "example":
            overlays.append(str(write_example_overlay(cfg.out_dir)))
        elif cfg.overlay:
            overlays.append(cfg.overlay)
        render_report([str(r.path) for r in runs], str(report), overlays=overlays)
    return StudyResult(cfg, runs, report, time.perf_counter() - t0)

"""The reference study behind ``stepscope demo``: seeds x variants, every instrument on.

For each variant (``plain``, ``residual``) and seed, the Ciresan-style MLP trains on the bundled
digits with the :class:`~stepscope.HistoryCollector` on (all five streams, default cadence), the
:class:`~stepscope.DenseProbe` on the cadence its helper qualifies (<= 5% overhead, measured
on a copy of the model) plus each epoch's end, around predeclared steps, validation
rows every epoch and a test row at the declared endpoint, and checkpoints at three points that the
offline curvature panel (:func:`~stepscope.curvature.run_curvature_panel`) analyses afterwards.
Every run is one artifact directory; the report (:mod:`stepscope.report`) reads them all.

Example
-------
>>> from stepscope.demo.study import StudyConfig, run_study
>>> result = run_study(StudyConfig(quick=True, out_dir="runs/demo"))  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import torch
import torch.nn.functional as F

from stepscope.collect import ALL_STREAMS, HistoryCollector, WatchSettings
from stepscope.demo import model as model_module
from stepscope.demo.data import DigitSplits, load_digits_splits
from stepscope.demo.model import Residual, ciresan_mlp
from stepscope.demo.run import Progress, evaluate, print_dataset_statistics
from stepscope.errors import Refusal


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


@dataclass
class StudyResult:
    config: StudyConfig
    runs: list[RunSummary]
    report: Path | None
    elapsed_seconds: float


def _probe_cadence(
    cfg: StudyConfig,
    probe: object,
    model: torch.nn.Module,
    splits: DigitSplits,
    steps_per_epoch: int,
) -> tuple[int, dict]:
    """The probe cadence: the user's, or the densest one the probe's helper qualifies (<= target).

    The helper times the probe against real training steps of a *copy* of the model (the run
    itself is untouched) and never changes precision; its decision and timings are recorded.
    """
    import copy

    from stepscope._purity import preserved_state
    from stepscope.probe import plan_cadence

    if cfg.probe_every is not None:
        return cfg.probe_every, {"rule": "user", "cadence_steps": cfg.probe_every}
    twin = copy.deepcopy(model)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    x, y = splits.train_x[: cfg.batch_size], splits.train_y[: cfg.batch_size]

    def step() -> None:
        loss = F.cross_entropy(twin(x), y)
        twin_opt.zero_grad(set_to_none=True)
        loss.backward()
        twin_opt.step()

    with preserved_state(twin):  # the twin's dropout/stochastic depth draws leave no trace
        decision = plan_cadence(
            probe,
            twin,
            step,
            target=cfg.probe_overhead_target,
            repeats=3,
            max_cadence=None,
        )
    record = decision.to_dict()
    every = decision.cadence_steps or steps_per_epoch  # infeasible: epoch ends only (recorded)
    return every, record


def _checkpoint_epochs(epochs: int) -> list[int]:
    """Three checkpoints: initialisation, the middle, the end (fewer if there are fewer epochs)."""
    return sorted({0, (epochs + 1) // 2, epochs})


def train_run(
    cfg: StudyConfig, splits: DigitSplits, variant: str, seed: int, stream: TextIO
) -> RunSummary:
    """Train one (variant, seed) run with every instrument on; returns its summary."""
    from stepscope.curvature import make_panel_pins, run_curvature_panel
    from stepscope.probe import DenseProbe, write_probe_record

    path = Path(cfg.out_dir) / f"{variant}-seed{seed}"
    if path.exists():
        shutil.rmtree(path)  # the demo owns its output directory: a rerun starts fresh
    torch.manual_seed(seed)
    residual = variant == "residual"

    def factory() -> torch.nn.Module:
        return ciresan_mlp(
            n_inputs=splits.n_features,
            width_scale=cfg.width_scale,
            residual=residual,
            survival=cfg.survival if residual else 1.0,
        )

    model = factory()
    branches = [(n, m) for n, m in model.named_modules() if isinstance(m, Residual)]
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    probe = DenseProbe(
        splits.train_x,
        splits.train_y,
        size=cfg.probe_size,
        seed=20260909 + seed,
        input_normalization=splits.normalisation,
    )
    n = len(splits.train_y)
    steps_per_epoch = (n + cfg.batch_size - 1) // cfg.batch_size
    probe_every, cadence_record = _probe_cadence(cfg, probe, model, splits, steps_per_epoch)
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
    probe.snapshot_init(model)
    ckpt_dir = path / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    checkpoints: dict[int, Path] = {}
    keep = _checkpoint_epochs(cfg.epochs)

    def save(epoch: int) -> None:
        if epoch in keep:
            checkpoints[epoch] = ckpt_dir / f"epoch-{epoch:03d}.pt"
            torch.save(model.state_dict(), checkpoints[epoch])

    gen = torch.Generator().manual_seed(seed)
    t0, step, val = time.perf_counter(), 0, {}
    try:
        save(0)
        write_probe_record(collector.writer, probe.measure(model, step=0, examples_seen=0, epoch=0))
        collector.log_eval(
            "validation",
            evaluate(model, splits.val_x, splits.val_y),
            sample_count=len(splits.val_y),
            data_hash=splits.split_hash,
            epoch=0,
        )
        for epoch in range(cfg.epochs):
            order = torch.randperm(n, generator=gen)
            bar = Progress(steps_per_epoch, f"{variant} seed {seed} epoch {epoch + 1}/{cfg.epochs}")
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
                        with probe.around_step(model, step=step, optimizer=opt):
                            opt.step()
                    else:
                        opt.step()
                    st.log("train/loss", loss)
                    st.log("train/lr", opt.param_groups[0]["lr"])
                    for name, block in branches:  # realised stochastic depth, never "time saved"
                        width = block.block[0].in_features
                        collector.log_mask(
                            name,
                            torch.tensor([float(block.last_active)]),
                            nominal_macs_per_unit=float(len(idx) * width * width),
                        )
                        st.log(f"branch/{name}/survival_probability", block.survival)
                step += 1
                if probed:  # outside the transaction, in eval mode: nothing leaks into the step
                    seen = collector.last_block.examples_seen  # the step just recorded
                    rec = probe.measure(model, step=step, examples_seen=seen, epoch=epoch)
                    write_probe_record(collector.writer, rec)
                bar.advance(note=f"loss {float(loss.detach()):.3f}")
            val = evaluate(model, splits.val_x, splits.val_y)
            collector.log_eval(
                "validation",
                val,
                sample_count=len(splits.val_y),
                data_hash=splits.split_hash,
                epoch=epoch + 1,
            )
            save(epoch + 1)
        test = evaluate(model, splits.test_x, splits.test_y)
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
    x, y = probe._inputs, probe._labels
    pins = make_panel_pins([model_module.__file__], checkpoints, (x, y))
    panel = run_curvature_panel(factory, checkpoints, (x, y), path / "curvature", pins)
    files = sorted(p.name for p in (path / "curvature").glob("curvature-*.json"))
    print(
        f"{variant} seed {seed}: {step} steps, validation accuracy {val.get('accuracy', float('nan')):.3f}, "
        f"test accuracy {test['accuracy']:.3f}; telemetry {collector.telemetry_seconds:.2f} s of {elapsed:.2f} s; "
        f"curvature at epochs {sorted(checkpoints)} ({panel.get('status', 'done') if isinstance(panel, dict) else 'done'})",
        file=stream,
    )
    return RunSummary(
        variant, seed, path, step, val, test, collector.telemetry_seconds, elapsed, files
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
        try:
            from stepscope.report import render_report
        except ImportError:
            print("report: the report module is not available in this version", file=stream)
        else:
            report = Path(cfg.out_dir) / "report.html"
            render_report([str(r.path) for r in runs], str(report))
    return StudyResult(cfg, runs, report, time.perf_counter() - t0)

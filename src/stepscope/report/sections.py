"""Report sections built from the artifacts: curves, branch activity, layers, moments, histograms.

Each builder takes the :class:`~stepscope.report.model.ReportRun` list and returns a
:class:`~stepscope.report.model.Section`. A quantity that no run recorded becomes a
``no data recorded`` note naming the rows that were looked for; nothing is drawn as zero.

Example
-------
>>> from stepscope.report.model import ReportRun
>>> runs = [ReportRun.open("runs/a"), ReportRun.open("runs/b")]  # needs recorded runs  # doctest: +SKIP
>>> curves_section(runs, endpoints=[0, 99]).has_data  # needs recorded runs  # doctest: +SKIP
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stepscope.report import data as D
from stepscope.report.model import Item, Note, ReportRun, Section, Table, fmt, no_data
from stepscope.report.overlay import Overlay
from stepscope.report.plots import Trace, heatmap_plot, line_plot

PROBE_CE, PROBE_ACC = "probe/model/loss", "probe/model/accuracy_fraction"
TRAIN_LOSS_NAMES = ("loss", "train/loss")  # user scalars drawn as the minibatch training loss


def seed_traces(label: str, per_run: list[tuple[str, np.ndarray, np.ndarray]]) -> list[Trace]:
    """Each run's trace, and for several runs a mean with a labelled min–max interval.

    The mean and interval are taken only at x values where *every* run has a defined value
    (elsewhere they are NaN gaps): a mean over fewer runs would silently change its meaning.
    """
    per_run = [(n, x, y) for n, x, y in per_run if np.isfinite(y).any()]
    if len(per_run) < 2:
        return [Trace(f"{label} · {n}", x, y, group=label) for n, x, y in per_run]
    traces = [Trace(f"{label} · {n}", x, y, kind="seed", group=label) for n, x, y in per_run]
    xs = np.unique(np.concatenate([x[np.isfinite(x)] for _, x, _ in per_run]))
    stack = np.full((len(per_run), len(xs)), np.nan)
    for i, (_, x, y) in enumerate(per_run):
        ok = np.isfinite(x)
        stack[i, np.searchsorted(xs, x[ok])] = y[ok]
    full = np.isfinite(stack).all(axis=0)
    if not full.any():  # e.g. seconds axes: runs share no x value, so no honest mean exists
        return traces
    mean = np.where(full, np.nanmean(np.where(full, stack, 0.0), axis=0), np.nan)
    lo = np.where(full, np.min(np.where(full, stack, np.inf), axis=0), np.nan)
    hi = np.where(full, np.max(np.where(full, stack, -np.inf), axis=0), np.nan)
    n = len(per_run)
    band = f"{label} · min–max over {n} runs"
    traces.append(Trace(f"{label} · mean of {n} runs", xs, mean, "mean", (lo, hi), band, label))
    return traces


def _sources(run: ReportRun) -> dict[str, tuple[np.ndarray, str | None, str | None]]:
    """``source label -> (steps, CE name, accuracy name)`` for the probe and each eval split."""
    h = run.reader
    out: dict[str, tuple[np.ndarray, str | None, str | None]] = {}
    steps = D.probe_steps(h)
    if len(steps):
        out["probe"] = (steps, PROBE_CE, PROBE_ACC)
    for split, metrics in sorted(D.eval_metrics(h).items()):
        ce = next((metrics[m] for m in metrics if m in ("loss", "ce", "cross_entropy")), None)
        acc = next((metrics[m] for m in sorted(metrics) if m.startswith("acc")), None)
        names = [n for n in (ce, acc) if n]
        steps = D.scalar_steps(h, names)
        if split in D.ENDPOINT_ONLY_SPLITS:  # official test: only at declared endpoints
            declared = D.endpoint_steps(h, split)
            steps = steps[np.isin(steps, declared if declared is not None else [])]
        if names and len(steps):
            out[f"eval/{split}"] = (steps, ce, acc)
    return out


def _overlay_traces(overlays: Sequence[Overlay], metric: str) -> list[Trace]:
    """Each overlay's saved points of ``metric``, one marker-only trace per split label."""
    out = []
    for ov in overlays:
        splits = sorted({p.split for p in ov.points if p.metric == metric})
        for split in splits:
            pts = sorted(
                (p.optimizer_step, p.value)
                for p in ov.points
                if p.metric == metric and p.split == split
            )
            x, y = (np.array(v, float) for v in zip(*pts))
            out.append(Trace(f"{ov.legend} · {split}", x, y, kind="overlay", group=ov.legend))
    return out


def curves_section(
    runs: list[ReportRun], endpoints: list[int], overlays: Sequence[Overlay] = ()
) -> Section:
    """Probe and validation CE/accuracy vs optimizer step and isolated training seconds.

    ``overlays`` (:mod:`stepscope.report.overlay`) add sparse historical points to the
    optimizer-step plots, in a distinct marker-only style labelled with their regime.
    """
    sec = Section("curves", "Probe and validation cross-entropy and accuracy")
    labels = sorted({s for r in runs for s in _sources(r)})
    if not labels:
        sec.items.append(
            no_data("probe or validation CE/accuracy", "probe/model/*, eval/<split>/*")
        )
    has_clock = any(D.TRAIN_CLOCK in r.reader.scalar_names for r in runs)
    marks = [(float(e), f"endpoint {e}") for e in endpoints]
    mixed: set[str] = set()
    for metric, col, unit in (("cross-entropy", 1, "nats/example"), ("accuracy", 2, "fraction")):
        for axis in ("optimizer step", "isolated training seconds"):
            if axis != "optimizer step" and not has_clock:
                continue
            traces: list[Trace] = []
            for (label, group), members in _by_group(runs, labels):
                per_run = []
                for r in members:
                    src = _sources(r).get(label)
                    if src is None:
                        continue
                    steps, ce_name, acc_name = src
                    name = ce_name if col == 1 else acc_name
                    if name is None:
                        continue
                    y = D.scalar_on(r.reader, name, steps)
                    x = steps.astype(float)
                    if axis != "optimizer step":
                        x = D.scalar_on(r.reader, D.TRAIN_CLOCK, steps)
                    per_run.append((r.label, x, y))
                if label == "probe" and not _same_probe(members):
                    # never average probe curves of different examples (docs/probe.md)
                    traces += [Trace(f"{label}{group} · {n}", x, y) for n, x, y in per_run]
                    mixed.add(f"probe{group}")
                    continue
                traces += seed_traces(label + group, per_run)
            if axis == "optimizer step":
                traces += _overlay_traces(overlays, metric)
            if traces:
                sec.items.append(
                    line_plot(
                        f"{metric} vs {axis}",
                        axis,
                        f"{metric} ({unit})",
                        traces,
                        markers=marks if axis == "optimizer step" else None,
                        caption="probe: the fixed dense-probe subset of the training split; "
                        "eval/<split>: the run's evaluation rows. Several runs of one recipe: thin "
                        "seed traces behind their mean, shaded min–max interval, both only where "
                        "every run has a value; recipes (run record extra 'recipe'/'variant') are "
                        "never averaged together.",
                    )
                )
    if overlays:  # one note, not a second variant of the shared caption
        sec.items.append(
            Note(
                "Hollow diamonds (optimizer-step plots): saved evaluation points of a historical "
                "run, a different source/recipe/hardware regime, sparse observations (not a "
                "curve); historical val_* is its official test."
            )
        )
    for what in sorted(mixed):
        sec.items.append(
            Note(
                f"{what}: the runs probed different examples (probe.json sha256 differ), so no "
                "mean or interval is drawn over them; use one probe across recipes and seeds."
            )
        )
    if not has_clock:
        sec.items.append(no_data("isolated training seconds", f"scalar rows {D.TRAIN_CLOCK}"))
    sec.items.append(_elapsed_plot(runs))
    for name in TRAIN_LOSS_NAMES:
        traces = []
        for (_, group), members in _by_group(runs, [name]):
            loss = [(r.label, *_user_series(r, name)) for r in members]
            traces += seed_traces(name + group, [x for x in loss if len(x[1])])
        if traces:
            sec.items.append(
                line_plot(
                    f"training minibatch loss (user scalar '{name}')",
                    "optimizer step",
                    "loss",
                    traces,
                )
            )
    return sec


def _same_probe(members: list[ReportRun]) -> bool:
    """Whether the runs' persisted probe identities agree (runs without ``probe.json`` — written
    before identities were persisted — are not held against it)."""
    from stepscope.probe.sink import read_probe_identity

    found = {(read_probe_identity(r.path) or {}).get("sha256") for r in members} - {None}
    return len(found) <= 1


def _by_group(
    runs: list[ReportRun], labels: list[str]
) -> list[tuple[tuple[str, str], list[ReportRun]]]:
    """``((label, group suffix), runs)`` per label and recipe; one recipe: an empty suffix."""
    groups: dict[str, list[ReportRun]] = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    out = []
    for label in labels:
        for g, members in groups.items():
            out.append(((label, f" · {g}" if len(groups) > 1 else ""), members))
    return out


def _user_series(run: ReportRun, name: str) -> tuple[np.ndarray, np.ndarray]:
    steps, values = D.scalar_rows(run.reader, name)
    return steps.astype(float), values


def _elapsed_plot(runs: list[ReportRun]) -> Item:
    traces, sources = [], set()
    for r in runs:
        h = r.reader
        steps, _, wall = D.step_clock(h)
        if D.ELAPSED_CLOCK in h.scalar_names:
            y, src = D.scalar_on(h, D.ELAPSED_CLOCK, steps), D.ELAPSED_CLOCK
        else:
            y, src = wall - h.run.created_unix, "step wall_time - run created_unix"
        sources.add(src)
        traces.append(Trace(f"total elapsed · {r.label}", steps.astype(float), y))
        for name, what in ((D.TRAIN_CLOCK, "training"), (D.TELEMETRY_CLOCK, "telemetry")):
            if name in h.scalar_names:
                y = D.scalar_on(h, name, steps)
                traces.append(Trace(f"{what} · {r.label}", steps.astype(float), y))
                sources.add(name)
    if not any(np.isfinite(t.y).any() for t in traces):
        return no_data("total elapsed time", f"{D.ELAPSED_CLOCK} rows or step wall times")
    return line_plot(
        "total elapsed time, shown apart from training and telemetry time",
        "optimizer step",
        "seconds",
        traces,
        caption="Total elapsed includes evaluation, telemetry and everything else; source: "
        + ", ".join(sorted(sources))
        + ".",
    )


def branch_section(runs: list[ReportRun]) -> Section:
    """Branch activity (``branch/<b>/<q>`` rows) vs step, beside measured throughput."""
    sec = Section("branch", "Branch activity and measured training throughput")
    quantities = sorted(
        {q for r in runs for b in D.branch_quantities(r.reader).values() for q in b}
    )
    if not quantities:
        sec.items.append(no_data("branch activity", "scalar rows branch/<branch>/<quantity>"))
    for q in quantities:
        traces = []
        for r in runs:
            for b, names in sorted(D.branch_quantities(r.reader).items()):
                if q in names:
                    x, y = _user_series(r, names[q])
                    traces.append(Trace(f"{b} · {r.label}", x, y))
        sec.items.append(line_plot(f"branch {q} vs optimizer step", "optimizer step", q, traces))
    traces, hows = [], set()
    for r in runs:
        steps, rate, how = D.throughput(r.reader)
        hows.add(how)
        traces.append(Trace(r.label, steps.astype(float), rate))
    if any(np.isfinite(t.y).any() for t in traces):
        sec.items.append(
            line_plot(
                "measured training throughput",
                "optimizer step",
                "examples / second",
                traces,
                caption="Measured as " + "; ".join(sorted(hows)) + ". Nominal skipped work is "
                "not measured time.",
            )
        )
    else:
        sec.items.append(no_data("training throughput", "examples_seen with wall times/clocks"))
    return sec


HEATMAPS = (
    ("gradient_l2", "training-minibatch gradient L2 (sqrt of sum_squares, gradient stream)", True),
    ("parameter_l2", "training-step parameter L2 (sqrt of sum_squares, parameter stream)", True),
    (
        "update_to_parameter_ratio",
        "training-step update / parameter ratio (RMS(update) / RMS(parameter))",
        True,
    ),
    (
        "activation_zero_fraction",
        "training-minibatch activation zero fraction (zero / total)",
        False,
    ),
    (
        "backprop_zero_fraction",
        "training-minibatch backprop zero fraction (zero / total, activation_grad)",
        False,
    ),
)


def layers_section(runs: list[ReportRun]) -> Section:
    """Plot 3: layer x step heatmaps of dense-probe quantities for every run, then (apart, under
    their own titles) the sampled training-minibatch stream heatmaps."""
    sec = Section("layers", "Layer x step heatmaps: dense probe (Plot 3), then training streams")
    for r in runs:
        sec.items += _probe_heatmaps(r)
    for r in runs:
        sec.items += _training_heatmaps(r)
    return sec


def _probe_heatmaps(r: ReportRun) -> list[Item]:
    if not len(D.probe_steps(r.reader)):
        return [no_data(f"dense-probe layer heatmaps (Plot 3) · {r.label}", "probe/<layer>/* rows")]
    items: list[Item] = []
    for key, (title, log) in D.PROBE_LAYER_QUANTITIES.items():
        found = D.probe_layer_matrix(r.reader, key)
        if found is None or not np.isfinite(found[2]).any():
            items.append(no_data(f"{title} · {r.label}", f"probe/<layer>/{key} rows"))
            continue
        layers, steps, values = found
        items.append(
            heatmap_plot(
                f"{title} · {r.label}",
                layers,
                steps,
                values,
                key,
                log=log,
                nonfinite=np.zeros(values.shape, dtype=bool),
                caption="Measured on the fixed dense probe (eval mode) at the probe steps; "
                "update ratio only after predeclared one-step updates.",
            )
        )
    return items


def _training_heatmaps(r: ReportRun) -> list[Item]:
    items: list[Item] = []
    mats = D.layer_quantities(r.reader)
    sample = r.reader.run.extra.get("update_sample_size")
    for key, title, log in HEATMAPS:
        m = mats[key]
        if m is None or not m.observed.any():
            stream = {"gradient_l2": "gradient", "activation_zero_fraction": "activation"}
            items.append(
                no_data(f"{title} · {r.label}", f"observed {stream.get(key, key)} spine rows")
            )
            continue
        cap = f"Sampled training minibatch stream. Definition: {m.definition}."
        if key == "update_to_parameter_ratio" and sample:
            cap += f" Updates are sampled (up to {sample} coordinates per parameter)."
        items.append(
            heatmap_plot(
                f"{title} · {r.label}",
                m.sites,
                m.steps,
                m.values,
                key,
                log=log,
                nonfinite=m.nonfinite,
                caption=cap,
            )
        )
    return items


MOMENTS = (
    ("grad_norm_rms", "per-example gradient RMS  sqrt(mean_i ||g_i||^2)"),
    ("covariance_trace", "gradient covariance trace  mean_i ||g_i||^2 - ||G||^2"),
    ("gradient_diversity", "gradient diversity (Yin)  sum_i ||g_i||^2 / ||sum_i g_i||^2"),
)


def _validity(h: Any, layer: str, steps: np.ndarray) -> Callable[[str], np.ndarray]:
    def read(key: str) -> np.ndarray:
        return D.scalar_on(h, f"probe/{layer}/validity/{key}", steps)

    return read


def moments_section(runs: list[ReportRun]) -> Section:
    """Probe per-example gradient moments per layer with validity annotations."""
    sec = Section("moments", "Per-example gradient moments (dense probe; not curvature)")
    rows: list[list[str]] = []
    for r in runs:
        h = r.reader
        steps = D.probe_steps(h)
        layers = D.probe_layers(h)
        if not len(steps) or not layers:
            continue
        for key, title in MOMENTS:
            traces = []
            for layer in layers:
                y = D.scalar_on(h, f"probe/{layer}/{key}", steps)
                traces.append(Trace(f"layer {layer}", steps.astype(float), y))
                v = _validity(h, layer, steps)
                n_ex, finite = v("n_examples"), v("finite_examples")
                extra = ""
                if key == "covariance_trace":
                    extra = f"clipped at {int(np.nansum(v('covariance_clipped')))} steps"
                if key == "gradient_diversity":
                    extra = f"undefined at {int(np.sum(v('diversity_valid') == 0))} steps"
                rows.append(
                    [
                        r.label,
                        layer,
                        key,
                        f"{int(np.isfinite(y).sum())} of {len(steps)}",
                        fmt(float(np.nanmax(n_ex)) if np.isfinite(n_ex).any() else None),
                        fmt(float(np.nanmin(finite)) if np.isfinite(finite).any() else None),
                        extra,
                    ]
                )
            sec.items.append(
                line_plot(
                    f"{title} · {r.label}",
                    "optimizer step",
                    key,
                    traces,
                    logy=key != "covariance_trace",
                    caption="Gaps: the probe ran but the quantity was undefined (see validity).",
                )
            )
    if rows:
        header = ["run", "layer", "quantity", "defined at", "sample size", "min finite examples"]
        sec.items.append(Table("validity of the probe moments", [*header, "notes"], rows))
    else:
        sec.items.append(no_data("per-example gradient moments", "probe/<layer>/* rows"))
    return sec


def histograms_section(runs: list[ReportRun], limit: int = 40) -> Section:
    """Each site's histogram over time, every run in turn, up to ``limit`` panels in all; the
    panels left out are named in a note (a stated selection, never a silent cut)."""
    from stepscope.report.plots import histogram_plot

    sec = Section("histograms", "Histograms over time (signed log2 grid)")
    left, omitted = limit, []
    for r in runs:
        pairs = D.histogram_pairs(r.reader)
        if not pairs:
            sec.items.append(no_data(f"histograms · {r.label}", "histogram rows of any stream"))
        for site, stream in pairs:
            if left <= 0:
                omitted.append(f"{r.label}: {site} · {stream}")
                continue
            left -= 1
            sec.items.append(histogram_plot(D.histogram_grid(r.reader, site, stream)))
    if omitted:
        shown = ", ".join(omitted[:12]) + (" ..." if len(omitted) > 12 else "")
        sec.items.append(
            Note(
                f"{limit} histogram panels drawn (--histogram-limit); {len(omitted)} more not "
                f"drawn: {shown}."
            )
        )
    return sec

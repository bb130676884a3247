"""Report sections built from the artifacts: curves, branch activity, layers, moments, histograms.

Each builder takes the :class:`~stepscope.run.Run` list and returns a
:class:`~stepscope.report.model.Section`. A quantity that no run recorded becomes a
``no data recorded`` note naming the rows that were looked for; nothing is drawn as zero. The
curves section (:func:`~stepscope.report.curves.curves_section`,
:func:`~stepscope.report.curves.seed_traces`) is in :mod:`stepscope.report.curves`.

Example
-------
>>> from stepscope import open_run
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> runs = [open_run(run)]
>>> branch_section(runs).items[0].text  # no branch/<b>/<q> rows were recorded
'no data recorded: branch activity ...'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from stepscope.report import data as D
from stepscope.report.curves import (
    _user_series,
    seed_traces,
)
from stepscope.report.histplot import histogram_plot
from stepscope.report.model import (
    Item,
    Note,
    Section,
    Table,
    fmt,
    left_out_note,
    no_data,
    one_per_recipe,
    recipe_of,
    run_label,
)
from stepscope.report.plots import Plot, Trace, heatmap_plot, line_plot
from stepscope.run import Run

__all__ = [
    "HEATMAPS",
    "MOMENTS",
    "branch_section",
    "histograms_section",
    "layers_section",
    "moments_section",
]


def branch_section(runs: list[Run]) -> Section:
    """Branch activity (``branch/<b>/<q>`` rows) vs step, beside measured throughput.

    Seeds of one recipe are one mean line in a min–max band per branch (colour: branch, line
    style: recipe when there are several).
    """
    sec = Section("branch", "Branch activity and measured training throughput")
    quantities = sorted({q for r in runs for b in D.branch_quantities(r).values() for q in b})
    if not quantities:
        sec.items.append(
            no_data(
                "branch activity",
                "scalar rows branch/<branch>/<quantity>",
                "collector.log_mask(branch, keep) records them",
            )
        )
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(recipe_of(r), []).append(r)
    several = len(groups) > 1
    for q in quantities:
        traces = []
        for g, members in groups.items():
            branches = sorted({b for r in members for b in D.branch_quantities(r)})
            for b in branches:
                per_run = []
                for r in members:
                    names = D.branch_quantities(r).get(b, {})
                    if q in names:
                        per_run.append((run_label(r), *_user_series(r, names[q])))
                traces += seed_traces(b, per_run, (g or None) if several else None)
        sec.items.append(line_plot(f"branch {q} vs optimizer step", "optimizer step", q, traces))
    traces, hows = [], set()
    for g, members in groups.items():
        per_run = []
        for r in members:
            steps, rate, how = D.throughput(r)
            hows.add(how)
            per_run.append((run_label(r), steps.astype(float), rate))
        traces += seed_traces("throughput", per_run, (g or None) if several else None)
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
    if len(sec.items) > 2:  # the first two open, the rest folded
        sec.details[:0] = sec.items[1:-1]
        sec.items[1:-1] = []
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


def layers_section(runs: list[Run], every_seed: bool = False) -> Section:
    """Plot 3: layer x step heatmaps of dense-probe quantities, then (apart, under their own
    titles) the sampled training-minibatch stream heatmaps; one run per recipe unless
    ``every_seed``. Open: each run's first heatmap; folded: the others."""
    sec = Section("layers", "Layer x step heatmaps: dense probe (Plot 3), then training streams")
    shown, left = (runs, []) if every_seed else one_per_recipe(runs)
    for r in shown:
        items: list[Item] = [*_probe_heatmaps(r), *_training_heatmaps(r)]
        plots = [i for i in items if isinstance(i, Plot)]
        sec.items += [i for i in items if not isinstance(i, Plot)]
        sec.items += plots[:1]
        sec.details += plots[1:]
    note = left_out_note("layer heatmaps", left)
    if note is not None:
        sec.details.append(note)
    return sec


def _probe_heatmaps(r: Run) -> list[Item]:
    if not len(D.probe_steps(r)):
        return [
            no_data(
                f"dense-probe layer heatmaps (Plot 3) · {run_label(r)}",
                "probe/<layer>/* rows",
                "attach ss.DenseProbe(...) to the collector",
            )
        ]
    items: list[Item] = []
    for key, (title, log) in D.PROBE_LAYER_QUANTITIES.items():
        found = D.probe_layer_matrix(r, key)
        if found is None or not np.isfinite(found[2]).any():
            items.append(no_data(f"{title} · {run_label(r)}", f"probe/<layer>/{key} rows"))
            continue
        layers, steps, values = found
        items.append(
            heatmap_plot(
                f"{title} · {run_label(r)}",
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


def _training_heatmaps(r: Run) -> list[Item]:
    items: list[Item] = []
    mats = D.layer_quantities(r)
    sample = r.run.extra.get("update_sample_size")
    for key, title, log in HEATMAPS:
        m = mats[key]
        if m is None or not m.observed.any():
            stream = {"gradient_l2": "gradient", "activation_zero_fraction": "activation"}
            items.append(
                no_data(f"{title} · {run_label(r)}", f"observed {stream.get(key, key)} spine rows")
            )
            continue
        cap = f"Sampled training minibatch stream. Definition: {m.definition}."
        if key == "update_to_parameter_ratio" and sample:
            cap += f" Updates are sampled (up to {sample} coordinates per parameter)."
        items.append(
            heatmap_plot(
                f"{title} · {run_label(r)}",
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


def moments_section(runs: list[Run], every_seed: bool = False) -> Section:
    """Probe per-example gradient moments per layer with validity annotations (one run per
    recipe unless ``every_seed``; the first plot open, the rest and the table folded)."""
    sec = Section("moments", "Per-example gradient moments (dense probe; not curvature)")
    rows: list[list[str]] = []
    shown, left = (runs, []) if every_seed else one_per_recipe(runs)
    for r in shown:
        h = r
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
                        run_label(r),
                        layer,
                        key,
                        f"{int(np.isfinite(y).sum())} of {len(steps)}",
                        fmt(float(np.nanmax(n_ex)) if np.isfinite(n_ex).any() else None),
                        fmt(float(np.nanmin(finite)) if np.isfinite(finite).any() else None),
                        extra,
                    ]
                )
            (sec.details if sec.items else sec.items).append(
                line_plot(
                    f"{title} · {run_label(r)}",
                    "optimizer step",
                    key,
                    traces,
                    logy=key != "covariance_trace",
                    caption="Gaps: the probe ran but the quantity was undefined (see validity).",
                )
            )
    if rows:
        header = ["run", "layer", "quantity", "defined at", "sample size", "min finite examples"]
        sec.details.append(Table("validity of the probe moments", [*header, "notes"], rows))
        note = left_out_note("probe moments", left)
        if note is not None:
            sec.details.append(note)
    else:
        sec.items.append(
            no_data(
                "per-example gradient moments",
                "probe/<layer>/* rows",
                "attach ss.DenseProbe(...) to the collector",
            )
        )
    return sec


def histograms_section(runs: list[Run], limit: int = 8, every_seed: bool = False) -> Section:
    """Each site's histogram over time, one run per recipe (unless ``every_seed``), up to
    ``limit`` panels in all; the panels left out are named in a note (a stated selection, never a
    silent cut). Open: the first panel holding a NaN/inf count (else the first panel)."""
    sec = Section("histograms", "Histograms over time (signed log2 grid)")
    left, omitted = limit, []
    shown, seeds = (runs, []) if every_seed else one_per_recipe(runs)
    panels: list[Plot] = []
    for r in shown:
        pairs = D.histogram_pairs(r)
        if not pairs:
            sec.items.append(
                no_data(
                    f"histograms · {run_label(r)}",
                    "histogram rows of any stream",
                    "WatchSettings histogram cadences record them",
                )
            )
        for site, stream in pairs:
            if left <= 0:
                omitted.append(f"{run_label(r)}: {site} · {stream}")
                continue
            left -= 1
            panels.append(histogram_plot(D.histogram_grid(r, site, stream)))
    bad = [
        p for p in panels if any(p.data["specials"][k].sum() for k in ("nan", "posinf", "neginf"))
    ]
    first = (bad or panels)[:1]
    sec.items += first
    sec.details += [p for p in panels if p not in first]
    if omitted:
        shown_names = ", ".join(omitted[:12]) + (" ..." if len(omitted) > 12 else "")
        sec.details.append(
            Note(
                f"{limit} histogram panels drawn (--histogram-limit); {len(omitted)} more not "
                f"drawn: {shown_names}."
            )
        )
    note = left_out_note("histograms", seeds)
    if note is not None:
        sec.details.append(note)
    return sec

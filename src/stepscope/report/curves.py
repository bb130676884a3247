"""The curves section: probe and validation CE/accuracy, elapsed time, training loss.

:func:`curves_section` draws each run's probe and evaluation curves against optimizer step and
isolated training seconds; :func:`seed_traces` turns several runs of one recipe into thin seed
traces behind their mean and min–max interval, taken only where every run has a value.

Example
-------
>>> import numpy as np
>>> from stepscope.report.curves import seed_traces
>>> x = np.array([0.0, 1.0, 2.0])
>>> a, b = np.array([1.0, 2.0, 3.0]), np.array([3.0, 4.0, np.nan])
>>> traces = seed_traces("probe", [("a", x, a), ("b", x, b)])
>>> [t.kind for t in traces]
['seed', 'seed', 'mean']
>>> traces[-1].y.tolist()  # no mean where run b has no value
[2.0, 3.0, nan]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stepscope.report import data as D
from stepscope.report.model import Item, Note, Section, no_data, recipe_of, run_label
from stepscope.report.overlay import Overlay
from stepscope.report.plots import Trace, line_plot
from stepscope.run import Run

PROBE_CE, PROBE_ACC = "probe/model/loss", "probe/model/accuracy_fraction"
TRAIN_LOSS_NAMES = ("loss", "train/loss")  # user scalars drawn as the minibatch training loss


def seed_traces(
    label: str, per_run: list[tuple[str, np.ndarray, np.ndarray]], family: str | None = None
) -> list[Trace]:
    """Each run's trace, and for several runs a mean with a labelled min–max interval.

    The mean and interval are taken only at x values where *every* run has a defined value
    (elsewhere they are NaN gaps): a mean over fewer runs would silently change its meaning.
    ``family`` (the recipe, when several are drawn) gives the traces a shared line style.
    """
    per_run = [(n, x, y) for n, x, y in per_run if np.isfinite(y).any()]
    tag = f"{label} · {family}" if family else label
    if len(per_run) < 2:
        return [Trace(f"{tag} · {n}", x, y, group=label, family=family) for n, x, y in per_run]
    traces = [
        Trace(f"{tag} · {n}", x, y, kind="seed", group=label, family=family) for n, x, y in per_run
    ]
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
    band = f"shaded: min–max over {n} runs"
    traces.append(
        Trace(f"{tag} · mean of {n} runs", xs, mean, "mean", (lo, hi), band, label, family)
    )
    return traces


def _sources(run: Run) -> dict[str, tuple[np.ndarray, str | None, str | None]]:
    """``source label -> (steps, CE name, accuracy name)`` for the probe and each eval split."""
    h = run
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
    runs: list[Run], endpoints: list[int], overlays: Sequence[Overlay] = ()
) -> Section:
    """Probe and validation CE/accuracy vs optimizer step and isolated training seconds.

    ``overlays`` (:mod:`stepscope.report.overlay`) add sparse historical points to the
    optimizer-step plots, in a distinct marker-only style labelled with their regime.
    """
    sec = Section("curves", "Probe and validation cross-entropy and accuracy")
    labels = sorted({s for r in runs for s in _sources(r)})
    if not labels:
        sec.items.append(
            no_data(
                "probe or validation CE/accuracy",
                "probe/model/*, eval/<split>/*",
                "attach ss.DenseProbe(...) or call collector.log_eval(split, {...})",
            )
        )
    has_clock = any(D.TRAIN_CLOCK in r.scalar_names for r in runs)
    marks = [(float(e), f"endpoint {e}") for e in endpoints]
    mixed: set[str] = set()
    for metric, col, unit in (("cross-entropy", 1, "nats/example"), ("accuracy", 2, "fraction")):
        for axis in ("optimizer step", "isolated training seconds"):
            if axis != "optimizer step" and not has_clock:
                continue
            traces: list[Trace] = []
            for (label, group), members in _by_group(runs, labels):
                family = group.removeprefix(" · ") or None
                per_run = []
                for r in members:
                    src = _sources(r).get(label)
                    if src is None:
                        continue
                    steps, ce_name, acc_name = src
                    name = ce_name if col == 1 else acc_name
                    if name is None:
                        continue
                    y = D.scalar_on(r, name, steps)
                    x = steps.astype(float)
                    if axis != "optimizer step":
                        x = D.scalar_on(r, D.TRAIN_CLOCK, steps)
                    per_run.append((run_label(r), x, y))
                if label == "probe" and not _same_probe(members):
                    # never average probe curves of different examples (docs/probe.md)
                    traces += [
                        Trace(f"{label}{group} · {n}", x, y, group=label, family=family)
                        for n, x, y in per_run
                    ]
                    mixed.add(f"probe{group}")
                    continue
                traces += seed_traces(label, per_run, family)
            if axis == "optimizer step":
                traces += _overlay_traces(overlays, metric)
            if traces:
                (sec.items if axis == "optimizer step" else sec.details).append(
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
    sec.details.append(_elapsed_plot(runs))
    for name in TRAIN_LOSS_NAMES:
        traces = []
        for (_, group), members in _by_group(runs, [name]):
            loss = [(run_label(r), *_user_series(r, name)) for r in members]
            family = group.removeprefix(" · ") or None
            traces += seed_traces(name, [x for x in loss if len(x[1])], family)
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


def _same_probe(members: list[Run]) -> bool:
    """Whether the runs' persisted probe identities agree (runs without ``probe.json`` — written
    before identities were persisted — are not held against it)."""
    from stepscope.probe.sink import read_probe_identity  # lazy: probe.sink imports torch

    found = {(read_probe_identity(r.path) or {}).get("sha256") for r in members} - {None}
    return len(found) <= 1


def _by_group(runs: list[Run], labels: list[str]) -> list[tuple[tuple[str, str], list[Run]]]:
    """``((label, group suffix), runs)`` per label and recipe; one recipe: an empty suffix."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(recipe_of(r), []).append(r)
    out = []
    for label in labels:
        for g, members in groups.items():
            out.append(((label, f" · {g}" if len(groups) > 1 else ""), members))
    return out


def _user_series(run: Run, name: str) -> tuple[np.ndarray, np.ndarray]:
    steps, values = D.scalar_rows(run, name)
    return steps.astype(float), values


def _elapsed_plot(runs: list[Run]) -> Item:
    traces, sources = [], set()
    for r in runs:
        h = r
        steps, _, wall = D.step_clock(h)
        if D.ELAPSED_CLOCK in h.scalar_names:
            y, src = D.scalar_on(h, D.ELAPSED_CLOCK, steps), D.ELAPSED_CLOCK
        else:
            y, src = wall - h.run.created_unix, "step wall_time - run created_unix"
        sources.add(src)
        traces.append(Trace(f"total elapsed · {run_label(r)}", steps.astype(float), y))
        for name, what in ((D.TRAIN_CLOCK, "training"), (D.TELEMETRY_CLOCK, "telemetry")):
            if name in h.scalar_names:
                y = D.scalar_on(h, name, steps)
                traces.append(Trace(f"{what} · {run_label(r)}", steps.astype(float), y))
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

"""The endpoints section: generalisation gap, predicted-class counts and confusion matrices.

The probe is a fixed subset of the *training* split, so the gap is "train probe minus evaluation";
class counts and confusion matrices make a dead class (never predicted) visible where an aggregate
accuracy would hide it.

Example
-------
>>> from stepscope import open_run
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> runs = [open_run(run)]
>>> endpoints_section(runs, default_endpoints(runs)).key
'endpoints'
"""

from __future__ import annotations

import numpy as np

from stepscope.report import data as D
from stepscope.report.curves import PROBE_ACC, PROBE_CE
from stepscope.report.model import (
    Note,
    Section,
    Table,
    fmt,
    left_out_note,
    no_data,
    one_per_recipe,
    run_label,
)
from stepscope.report.plots import bar_plot, matrix_plot
from stepscope.run import Run


def default_endpoints(runs: list[Run]) -> list[int]:
    """Default endpoints from the first run with probe rows.

    The first and last step where the probe and an evaluation were both taken (so the gap is
    defined there), plus the last evaluation when it comes later (a final evaluation at step N,
    after the last probe, is never left out); without a common step, the first probe step and
    the last evaluation (or the last probe step without evaluations); without a probe, the first
    and last committed step.
    """
    for r in runs:
        steps = D.probe_steps(r)
        if len(steps):
            names = [n for m in D.eval_metrics(r).values() for n in m.values()]
            evals = D.scalar_steps(r, names)
            both = np.intersect1d(steps, evals)
            pick = both if len(both) else steps
            ends = {int(pick[0]), int(pick[-1])}
            if len(evals) and int(evals[-1]) > max(ends):
                ends.add(int(evals[-1]))  # the final evaluation
            return sorted(ends)
    steps = runs[0].steps if runs else np.empty(0)
    return sorted({int(steps[0]), int(steps[-1])}) if len(steps) else []


def endpoints_section(runs: list[Run], endpoints: list[int], every_seed: bool = False) -> Section:
    """Generalisation gap, predicted-class counts and confusion matrices at the endpoints.

    Open: the gap at the last endpoint; folded: the gap at every endpoint, then class counts and
    confusion matrices (one run per recipe unless ``every_seed``).
    """
    from stepscope.probe.sink import read_probe_confusion  # lazy: probe.sink imports torch

    sec = Section("endpoints", "Generalisation gap, predicted classes and confusion at endpoints")
    rows: list[list[str]] = []
    for r in runs:
        h = r
        ep = np.array(endpoints, dtype=np.int64)
        p_acc, p_ce = D.scalar_on(h, PROBE_ACC, ep), D.scalar_on(h, PROBE_CE, ep)
        for split, m in sorted(D.eval_metrics(h).items()):
            acc = next((m[k] for k in sorted(m) if k.startswith("acc")), None)
            ce = next((m[k] for k in m if k in ("loss", "ce", "cross_entropy")), None)
            e_acc = D.scalar_on(h, acc, ep) if acc else np.full(len(ep), np.nan)
            e_ce = D.scalar_on(h, ce, ep) if ce else np.full(len(ep), np.nan)
            if split in D.ENDPOINT_ONLY_SPLITS:  # official test: declared endpoints only
                declared = D.endpoint_steps(h, split)
                hidden = ~np.isin(ep, declared if declared is not None else [])
                e_acc[hidden], e_ce[hidden] = np.nan, np.nan
            for i, step in enumerate(endpoints):
                gap_acc = p_acc[i] - e_acc[i]
                gap_ce = e_ce[i] - p_ce[i]
                rows.append(
                    [run_label(r), str(step), split]
                    + [
                        fmt(None if np.isnan(v) else float(v))
                        for v in (p_acc[i], e_acc[i], gap_acc)
                    ]
                    + [fmt(None if np.isnan(v) else float(v)) for v in (p_ce[i], e_ce[i], gap_ce)]
                )
    if rows:
        header = ["run", "step", "split", "probe acc", "eval acc", "acc gap (probe - eval)"]
        header += ["probe CE", "eval CE", "CE gap (eval - probe)"]
        last = [r for r in rows if r[1] == str(endpoints[-1])]
        title = "generalisation gap (probe: a fixed training subset)"
        sec.items.append(Table(f"{title} at step {endpoints[-1]}", header, last))
        sec.details.append(Table(f"{title}, every endpoint", header, rows))
        if all(r[5] == "not recorded" and r[8] == "not recorded" for r in rows):
            sec.items.append(
                Note(
                    "no data recorded: a generalisation gap at these endpoints (no evaluation "
                    "was taken at a probe step); pass --endpoints where both were taken."
                )
            )
    else:
        sec.items.append(
            no_data(
                "generalisation gap",
                "eval/<split>/* rows at the endpoints",
                "collector.log_eval(split, {...}) records them",
            )
        )
    drew = False
    shown, left = (runs, []) if every_seed else one_per_recipe(runs)
    for r in shown:
        h = r
        probe_at = set(D.probe_steps(h).tolist())
        counts_names = sorted(
            (n for n in h.scalar_names if n.startswith("probe/model/predicted_counts/")),
            key=lambda n: int(n.rsplit("/", 1)[1]),
        )
        groups = {}
        for step in endpoints:
            if step not in probe_at or not counts_names:
                continue
            groups[f"step {step}"] = np.array(
                [D.scalar_on(h, n, np.array([step]))[0] for n in counts_names]
            )
            drew = True
            sec.details.append(
                matrix_plot(
                    f"probe confusion at step {step} · {run_label(r)}",
                    read_probe_confusion(h, step),
                    "predicted class",
                    "true class",
                )
            )
        if groups:
            sec.details.insert(
                len(sec.details) - len(groups),
                bar_plot(
                    f"probe predicted-class counts · {run_label(r)}",
                    groups,
                    "class",
                    "examples predicted",
                    caption="A class never predicted (a dead class) shows as an empty bar.",
                ),
            )
        drew = _eval_confusions(sec, r, endpoints) or drew
    if not drew:
        sec.items.append(
            no_data(
                "predicted-class counts and confusion",
                "probe/model/* rows",
                "attach ss.DenseProbe(...) or log_eval(split, {'confusion': matrix})",
            )
        )
    note = left_out_note("class counts and confusion matrices", left)
    if note is not None and drew:
        sec.details.append(note)
    return sec


def eval_confusion(h: object, split: str, step: int) -> np.ndarray | None:
    """The ``(classes, classes)`` confusion logged for ``split`` at ``step`` via ``log_eval``
    (metric ``confusion``, stored as ``eval/<split>/confusion/<true>/<pred>``), or ``None``."""
    prefix = f"eval/{split}/confusion/"
    names = [n for n in h.scalar_names if n.startswith(prefix)]  # type: ignore[attr-defined]
    if not names:
        return None
    cells = {tuple(int(v) for v in n[len(prefix) :].split("/")): n for n in names}
    classes = 1 + max(max(k) for k in cells)
    out = np.full((classes, classes), np.nan)
    for (t, p), name in cells.items():
        out[t, p] = D.scalar_on(h, name, np.array([step]))[0]  # type: ignore[arg-type]
    return None if np.isnan(out).any() else out.astype(np.int64)


def _eval_confusions(sec: Section, r: Run, endpoints: list[int]) -> bool:
    """Evaluation-split confusion matrices at the endpoints (official test: declared only)."""
    drew = False
    for split in sorted(D.eval_metrics(r)):
        declared = D.endpoint_steps(r, split) if split in D.ENDPOINT_ONLY_SPLITS else None
        for step in endpoints:
            if split in D.ENDPOINT_ONLY_SPLITS and (declared is None or step not in declared):
                continue
            matrix = eval_confusion(r, split, step)
            if matrix is None:
                continue
            drew = True
            sec.details.append(
                matrix_plot(
                    f"{split} confusion at step {step} · {run_label(r)}",
                    matrix,
                    "predicted class",
                    "true class",
                )
            )
    return drew

"""Read what a report draws out of one artifact, as plain aligned numpy arrays.

Everything here reads the on-disk artifact (so an old run re-plots) and never invents a value:
a step where a quantity was not observed is ``NaN`` in a float array *and* ``False`` in the
matching ``observed`` mask, never ``0``. Plots draw those cells as gaps.

Scalar-row conventions the report recognises (see ``docs/report.md``):

- probe rows ``probe/<layer>/<key>`` and ``probe/model/...`` (:mod:`stepscope.probe.sink`);
- evaluation rows ``eval/<split>/<metric>`` (``loss``/``ce`` and ``accuracy*`` metrics);
  (the official ``test`` split only at evaluations declared ``endpoint`` in ``evals.log``);
- clocks ``clock/training_seconds`` (isolated training seconds), ``clock/telemetry_seconds``
  and ``clock/elapsed_seconds`` (:mod:`stepscope.runlog`);
- branch activity ``branch/<branch>/<quantity>`` (``active_fraction``, ``nominal_skipped_macs``,
  or your own, e.g. ``survival_probability``).

Example
-------
>>> import tempfile, torch, stepscope as ss
>>> from stepscope import open_run
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> settings = ss.WatchSettings(output_dir=tempfile.mkdtemp() + "/a")
>>> with ss.HistoryCollector(model, sites="Linear", settings=settings) as c:  # 3 recorded steps
...     for _ in range(3):
...         with c.step(opt, examples=16):
...             loss = model(torch.randn(16, 4)).pow(2).mean()
...             opt.zero_grad(); loss.backward(); opt.step()
>>> m = layer_quantities(open_run(c.run_dir))["gradient_l2"]
>>> m.values.shape == (len(m.sites), len(m.steps))
True
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stepscope.history.batch import OBSERVED
from stepscope.history.reader import HistoryReader
from stepscope.runlog.sink import read_eval_log
from stepscope.stats import SPECIAL_FIELDS, SPINE_FIELDS

_F = {name: i for i, name in enumerate(SPINE_FIELDS)}

#: Clock rows (cumulative seconds at the end of a step), as :mod:`stepscope.runlog.names` writes.
TRAIN_CLOCK = "clock/training_seconds"
TELEMETRY_CLOCK = "clock/telemetry_seconds"
ELAPSED_CLOCK = "clock/elapsed_seconds"
#: Official-test splits: plotted only at evaluations declared ``endpoint`` in ``evals.log``.
ENDPOINT_ONLY_SPLITS = ("test",)
EVAL_PATTERN = re.compile(r"^eval/(?P<split>[^/]+)/(?P<metric>.+)$")
BRANCH_PATTERN = re.compile(r"^branch/(?P<branch>[^/]+)/(?P<quantity>.+)$")


@dataclass(frozen=True)
class StepMatrix:
    """A layer x step quantity. ``values`` is NaN wherever ``observed`` is False.

    Attributes
    ----------
    quantity
        What the numbers are (e.g. ``"gradient_l2"``).
    definition
        How each cell was computed from the spine, in words.
    sites
        Row labels (site names).
    steps
        Column coordinates (optimizer steps, every committed step of the run).
    values
        ``(len(sites), len(steps))`` float64.
    observed
        Same shape; True where the cell holds a defined value.
    nonfinite
        Same shape; True where the observed tensor held NaN or infinities (the value then covers
        the finite entries only).
    """

    quantity: str
    definition: str
    sites: tuple[str, ...]
    steps: np.ndarray
    values: np.ndarray
    observed: np.ndarray
    nonfinite: np.ndarray


def _spine_cells(
    reader: HistoryReader, stream: str
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Whole-step spine rows of one stream aligned on the run's steps, by site name."""
    steps = reader.steps
    names = {s.site_id: s.name for s in reader.sites}
    rows = reader.table("observations", stream)
    rows = rows[(rows["micro_batch"] == -1) & (rows["presence"] == OBSERVED)]
    sites = sorted({names[int(i)] for i in np.unique(rows["site"])}, key=_natural)
    spine = np.full((len(sites), len(steps), len(SPINE_FIELDS)), np.nan)
    have = np.zeros((len(sites), len(steps)), dtype=bool)
    col = np.searchsorted(steps, rows["step"])
    ok = (col < len(steps)) & (steps[np.minimum(col, len(steps) - 1)] == rows["step"])
    row_of = {name: i for i, name in enumerate(sites)}
    r = np.array([row_of[names[int(i)]] for i in rows["site"]], dtype=np.int64)
    spine[r[ok], col[ok]] = rows["spine"][ok]
    have[r[ok], col[ok]] = True
    return sites, steps, spine, have


def _natural(name: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _matrix(
    reader: HistoryReader,
    stream: str,
    quantity: str,
    definition: str,
    fn: Callable[[np.ndarray], np.ndarray],
) -> StepMatrix | None:
    sites, steps, spine, have = _spine_cells(reader, stream)
    if not sites:
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.where(have, fn(spine), np.nan)
    observed = have & np.isfinite(values)
    values[~observed] = np.nan
    nonfinite = have & (spine[..., _F["finite"]] < spine[..., _F["total"]])
    return StepMatrix(quantity, definition, tuple(sites), steps, values, observed, nonfinite)


def _l2(s: np.ndarray) -> np.ndarray:
    return np.sqrt(s[..., _F["sum_squares"]])


def _zero_fraction(s: np.ndarray) -> np.ndarray:
    return s[..., _F["zero"]] / s[..., _F["total"]]


def _rms(s: np.ndarray) -> np.ndarray:
    return np.sqrt(s[..., _F["sum_squares"]] / s[..., _F["finite"]])


def layer_quantities(reader: HistoryReader) -> dict[str, StepMatrix | None]:
    """The five layer x step heatmap quantities (``None`` where the stream was not recorded).

    - ``gradient_l2``: ``sqrt(sum_squares)`` of the ``gradient`` stream (finite entries).
    - ``parameter_l2``: ``sqrt(sum_squares)`` of the ``parameter`` stream.
    - ``update_to_parameter_ratio``: ``RMS(update) / RMS(parameter)`` at steps where both were
      observed; equals ``||dW|| / ||W||`` when the update is not sampled (the run record says
      ``update_sample_size``; a sampled update estimates the RMS from the sampled coordinates).
    - ``activation_zero_fraction``: ``zero / total`` of the ``activation`` stream.
    - ``backprop_zero_fraction``: ``zero / total`` of the ``activation_grad`` stream.
    """
    out: dict[str, StepMatrix | None] = {
        "gradient_l2": _matrix(reader, "gradient", "gradient_l2", "sqrt(sum_squares)", _l2),
        "parameter_l2": _matrix(reader, "parameter", "parameter_l2", "sqrt(sum_squares)", _l2),
        "activation_zero_fraction": _matrix(
            reader, "activation", "activation_zero_fraction", "zero / total", _zero_fraction
        ),
        "backprop_zero_fraction": _matrix(
            reader, "activation_grad", "backprop_zero_fraction", "zero / total", _zero_fraction
        ),
    }
    upd = _matrix(reader, "update", "update_rms", "sqrt(sum_squares / finite)", _rms)
    par = _matrix(reader, "parameter", "parameter_rms", "sqrt(sum_squares / finite)", _rms)
    out["update_to_parameter_ratio"] = None
    if upd is not None and par is not None:
        sites = tuple(s for s in upd.sites if s in par.sites)
        if sites:
            iu = [upd.sites.index(s) for s in sites]
            ip = [par.sites.index(s) for s in sites]
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = upd.values[iu] / par.values[ip]
            observed = upd.observed[iu] & par.observed[ip] & np.isfinite(ratio)
            ratio[~observed] = np.nan
            out["update_to_parameter_ratio"] = StepMatrix(
                "update_to_parameter_ratio",
                "RMS(update) / RMS(parameter)",
                sites,
                upd.steps,
                ratio,
                observed,
                upd.nonfinite[iu] | par.nonfinite[ip],
            )
    return out


@dataclass(frozen=True)
class HistogramGrid:
    """Histograms of one site and stream over time on the signed log2 grid.

    ``counts[k, j]`` is the count of signed bin ``bins[k]`` at ``steps[j]``; ``bins`` are signed
    indices (``b >= 0``: positive magnitude bin ``b``; ``b < 0``: negative magnitude bin ``-b-1``),
    most negative first; each sign keeps only its range of ever non-zero bins.
    ``bin_lower``/``bin_upper`` are the signed value bounds of each row. ``specials`` maps each
    special count name (zero, under/overflow per sign, NaN, +inf, -inf) to its counts over time.
    ``totals`` are all elements counted per step.
    """

    site: str
    stream: str
    steps: np.ndarray
    bins: np.ndarray
    bin_lower: np.ndarray
    bin_upper: np.ndarray
    counts: np.ndarray
    specials: dict[str, np.ndarray]
    totals: np.ndarray


def _used(block: np.ndarray) -> np.ndarray:
    """Magnitude bins from the smallest to the largest ever non-zero one (inclusive)."""
    nz = np.flatnonzero(block.sum(axis=1))
    return np.arange(nz[0], nz[-1] + 1) if len(nz) else np.empty(0, np.int64)


def histogram_pairs(reader: HistoryReader) -> list[tuple[str, str]]:
    """``(site name, stream)`` pairs that hold at least one histogram row, in catalog order."""
    names = {s.site_id: s.name for s in reader.sites}
    pairs: list[tuple[str, str]] = []
    for stream in ("activation", "activation_grad", "gradient", "parameter", "update"):
        rows = reader.table("histograms", stream)
        rows = rows[rows["micro_batch"] == -1]
        for name in sorted({names[int(i)] for i in np.unique(rows["site"])}, key=_natural):
            pairs.append((name, stream))
    return pairs


def histogram_grid(reader: HistoryReader, site: str, stream: str) -> HistogramGrid:
    """Whole-step histograms of ``site``/``stream``.

    Each sign is trimmed to its own range of ever non-zero magnitude bins, so the (possibly
    hundreds of) empty bins around zero are not drawn; zero and underflow are special bands.
    """
    ids = reader.site_ids(site)
    rows = reader.table("histograms", stream, site_ids=ids)
    rows = rows[rows["micro_batch"] == -1]
    rows = rows[np.argsort(rows["step"], kind="stable")]
    d = reader.descriptor
    nb = d.n_bins
    counts = rows["counts"].astype(np.int64).T  # (width, n_steps)
    edges = d.edges()
    neg_k = _used(counts[:nb])[::-1]  # most negative (largest magnitude) first
    pos_k = _used(counts[nb : 2 * nb])
    bins = np.concatenate([-neg_k - 1, pos_k])
    lower = np.concatenate([-edges[neg_k + 1], edges[pos_k]])
    upper = np.concatenate([-edges[neg_k], edges[pos_k + 1]])
    signed = np.concatenate([counts[:nb][neg_k], counts[nb : 2 * nb][pos_k]])
    specials = {name: counts[2 * nb + i] for i, name in enumerate(SPECIAL_FIELDS)}
    return HistogramGrid(
        site,
        stream,
        rows["step"].astype(np.int64),
        bins,
        lower,
        upper,
        signed,
        specials,
        counts.sum(axis=0),
    )


_SCALARS: weakref.WeakKeyDictionary[HistoryReader, dict[str, tuple[np.ndarray, np.ndarray]]] = (
    weakref.WeakKeyDictionary()
)


def scalar_rows(reader: HistoryReader, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of one user scalar in step order (empty if never written).

    The scalar table is read once per reader and grouped by name (the report asks for hundreds
    of probe rows; one table read each would dominate its run time).
    """
    cache = _SCALARS.get(reader)
    if cache is None:
        rows = reader.table("scalars")
        rows = rows[np.lexsort((rows["step"], rows["name"]))]
        cache = {}
        ids, starts = np.unique(rows["name"], return_index=True)
        ends = [*starts[1:], len(rows)]
        for i, a, b in zip(ids, starts, ends):
            cache[reader.scalar_names[int(i)]] = (rows["step"][a:b].copy(), rows["value"][a:b])
        _SCALARS[reader] = cache
    empty = (np.empty(0, np.int64), np.empty(0))
    return cache.get(name, empty)


def scalar_on(reader: HistoryReader, name: str, steps: np.ndarray) -> np.ndarray:
    """Scalar ``name`` aligned on ``steps``: NaN where no row was written (or no such scalar)."""
    out = np.full(len(steps), np.nan)
    at, values = scalar_rows(reader, name)
    if not len(at) or not len(steps):
        return out
    col = np.searchsorted(steps, at)
    ok = (col < len(steps)) & (steps[np.minimum(col, len(steps) - 1)] == at)
    out[col[ok]] = values[ok]
    return out


def scalar_steps(reader: HistoryReader, names: list[str]) -> np.ndarray:
    """Sorted union of the steps at which any of ``names`` has a row."""
    parts = [scalar_rows(reader, n)[0] for n in names]
    return np.unique(np.concatenate(parts)).astype(np.int64) if parts else np.empty(0, np.int64)


def probe_steps(reader: HistoryReader) -> np.ndarray:
    """Steps at which a dense probe was written (its ``probe/axes/examples_seen`` rows)."""
    return scalar_steps(reader, ["probe/axes/examples_seen"])


def probe_layers(reader: HistoryReader) -> list[str]:
    """Layer names that carry probe rows (``probe/<layer>/...``; ``model``/``axes`` excluded)."""
    found = {
        n.split("/")[1]
        for n in reader.scalar_names
        if n.startswith("probe/") and n.count("/") >= 2 and n.split("/")[1] not in ("model", "axes")
    }
    return sorted(found, key=_natural)


def eval_metrics(reader: HistoryReader) -> dict[str, dict[str, str]]:
    """``split -> {metric: scalar name}`` for every ``eval/<split>/<metric>`` row."""
    out: dict[str, dict[str, str]] = {}
    for name in reader.scalar_names:
        m = EVAL_PATTERN.match(name)
        if m:
            out.setdefault(m["split"], {})[m["metric"]] = name
    return out


def endpoint_steps(reader: HistoryReader, split: str) -> np.ndarray | None:
    """Steps of ``split``'s evaluations declared ``endpoint`` (``None``: no ``evals.log``)."""
    if not (reader.path / "evals.log").exists():
        return None

    steps = [r.optimizer_step for r in read_eval_log(reader) if r.split == split and r.endpoint]
    return np.unique(np.array(steps, dtype=np.int64))


def branch_quantities(reader: HistoryReader) -> dict[str, dict[str, str]]:
    """``branch -> {quantity: scalar name}`` for every ``branch/<branch>/<quantity>`` row."""
    out: dict[str, dict[str, str]] = {}
    for name in reader.scalar_names:
        m = BRANCH_PATTERN.match(name)
        if m:
            out.setdefault(m["branch"], {})[m["quantity"]] = name
    return out


def step_clock(reader: HistoryReader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(steps, examples_seen, wall_time)`` per committed step; NaN where unknown."""
    blocks = reader.step_blocks()
    steps = np.array([b.optimizer_step for b in blocks], dtype=np.int64)
    seen = np.array(
        [np.nan if b.examples_seen is None else b.examples_seen for b in blocks], dtype=float
    )
    wall = np.array([np.nan if b.wall_time is None else b.wall_time for b in blocks], dtype=float)
    return steps, seen, wall


def throughput(reader: HistoryReader) -> tuple[np.ndarray, np.ndarray, str]:
    """Measured training throughput (examples per second) per step and how it was measured.

    With an isolated training clock (``clock/train_s`` rows) the rate is examples per training
    second between consecutive clock rows; otherwise it is examples per wall-clock second
    between consecutive committed steps (which includes anything done between steps).
    """
    steps, seen, wall = step_clock(reader)
    clock = scalar_on(reader, TRAIN_CLOCK, steps)
    use_clock = np.isfinite(clock).sum() >= 2
    t = clock if use_clock else wall
    ok = np.isfinite(t) & np.isfinite(seen)
    rate = np.full(len(steps), np.nan)
    idx = np.flatnonzero(ok)
    if len(idx) >= 2:
        dt = np.diff(t[idx])
        dn = np.diff(seen[idx])
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(dt > 0, dn / dt, np.nan)
        rate[idx[1:]] = r
    how = (
        f"examples per isolated training second ({TRAIN_CLOCK})"
        if use_clock
        else "examples per wall-clock second between committed steps (includes non-training work)"
    )
    return steps, rate, how


#: The ``layers`` section's dense-probe quantities (docs/report.md), ``key -> (title, log colour scale)``.
PROBE_LAYER_QUANTITIES: dict[str, tuple[str, bool]] = {
    "grad_fro_legacy_scale": ("dense-probe gradient L2  ||G||_F of the mean-loss gradient", True),
    "param_l2": ("dense-probe parameter L2  ||W||", True),
    "delta_since_snapshot": ("dense-probe delta_since_snapshot  ||W - W(previous probe)||", True),
    "update_ratio": ("dense-probe update ratio  ||measured one-step update|| / ||W||", True),
    "activation_zero_fraction": ("dense-probe activation zero fraction (== 0)", False),
    "backprop_zero_fraction": ("dense-probe backprop zero fraction (== 0)", False),
}


def probe_layer_matrix(
    reader: HistoryReader, key: str
) -> tuple[list[str], np.ndarray, np.ndarray] | None:
    """``(layers, probe steps, values[layer, step])`` of ``probe/<layer>/<key>`` (NaN: no row).

    ``None`` when no layer has a row for ``key``.
    """
    steps = probe_steps(reader)
    layers = [lay for lay in probe_layers(reader) if f"probe/{lay}/{key}" in reader.scalar_names]
    if not layers or not len(steps):
        return None
    values = np.stack([scalar_on(reader, f"probe/{lay}/{key}", steps) for lay in layers])
    return layers, steps, values

"""Tables for analysts: a run's observations as pandas, polars or Arrow, with names, not codes.

:func:`frame_columns` turns the committed ``observations`` table into plain numpy columns;
``Run.to_pandas()``, ``Run.to_polars()`` and ``Run.to_arrow()`` (:mod:`stepscope.run`) hand them
to the library the user has (extras ``pandas``, ``polars``, ``arrow``; a missing one refuses
``extra_missing`` with the ``pip install`` line). Two shapes:

* **tidy** (default, one row per step x site x stream x phase x micro-batch x spine field):
  ``step, optimizer_step, examples_seen, epoch, micro_batch, site, module_type, stream, phase,
  field, value, presence``;
* **wide** (``wide=True``, one row per cell): the same key columns and ``presence``, then one
  column per spine field (``total, finite, nan, ..., mean, m2, ...``).

``step`` is the reader's step axis and ``optimizer_step`` names it as
:class:`~stepscope.history.StepBlockRecord` does (the collector records one block per optimizer
step, so the two are equal; both are kept so joins on either name work), ``micro_batch`` is ``-1``
for a whole-step cell, ``examples_seen`` and ``epoch`` are floats with NaN where unknown.
``value`` is NaN wherever ``presence`` is not ``"observed"`` (missing is never zero), exactly as
:meth:`stepscope.run.Run.series` returns it. :func:`series_text` is what
``print(series)`` shows: steps beside values, and the stream's cadence.

Example
-------
>>> import tempfile, torch, stepscope as ss
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with ss.HistoryCollector(model, sites="*", cadence=1) as c:
...     for _ in range(3):
...         with c.step(opt, examples=16):
...             loss = model(torch.randn(16, 4)).pow(2).mean()
...             opt.zero_grad(); loss.backward(); opt.step()
>>> df = ss.open_run(c.run_dir).to_pandas()
>>> df[(df.site == "1") & (df.field == "total")][["step", "stream", "value"]].to_string(index=False)
' step     stream  value\\n    0 activation  128.0\\n    1 activation  128.0\\n    2 activation  128.0'
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from stepscope.errors import Refusal, require_extra
from stepscope.history.vocab import Phase, Presence, Stream
from stepscope.stats.layout import SPINE_FIELDS

__all__ = [
    "KEY_COLUMNS",
    "frame_columns",
    "names_of",
    "series_frame",
    "series_label",
    "series_text",
    "site_int_refusal",
    "to_arrow",
    "to_pandas",
    "to_polars",
]

#: The key columns both shapes start with.
KEY_COLUMNS = (
    "step",
    "optimizer_step",
    "examples_seen",
    "epoch",
    "micro_batch",
    "site",
    "module_type",
    "stream",
    "phase",
)


def names_of(kind: type[enum.Enum], codes: np.ndarray) -> np.ndarray:
    """Storage codes (1-based, see :func:`~stepscope.history.batch.code_of`) as their names."""
    names = np.array(["invalid", *(m.value for m in kind)], dtype=object)
    return names[np.asarray(codes, dtype=np.int64)]


def _step_axis(reader: Any, steps: np.ndarray, column: str) -> np.ndarray:
    """``examples_seen`` / ``epoch`` of each row's step (NaN: unknown or no step block)."""
    blocks = reader.table("steps")
    order = np.argsort(blocks["step"], kind="stable")
    known, values = blocks["step"][order], blocks[column][order].astype(np.float64)
    values[values < 0] = np.nan
    at = np.clip(np.searchsorted(known, steps), 0, max(len(known) - 1, 0))
    out = np.full(len(steps), np.nan)
    if len(known):
        hit = known[at] == steps
        out[hit] = values[at[hit]]
    return out


def frame_columns(reader: Any, wide: bool = False) -> dict[str, np.ndarray]:
    """The observations of ``reader`` (a :class:`~stepscope.run.Run`) as columns.

    Parameters
    ----------
    reader
        An open reader (``ss.open_run(path)``).
    wide
        One column per spine field instead of the tidy ``field``/``value`` pair.

    Returns
    -------
    dict of str to numpy.ndarray
        Equal-length columns in the order of the module docstring; strings as object arrays.
    """
    rows = reader.table("observations")
    rows = rows[
        np.lexsort((rows["micro_batch"], rows["phase"], rows["stream"], rows["site"], rows["step"]))
    ]
    site_names = np.array([s.name for s in reader.sites] or [""], dtype=object)
    site_types = np.array([s.module_type for s in reader.sites] or [""], dtype=object)
    observed = rows["presence"] == list(Presence).index(Presence.OBSERVED) + 1
    spine = rows["spine"].astype(np.float64, copy=True)
    spine[~observed] = np.nan
    cols: dict[str, np.ndarray] = {
        "step": rows["step"].astype(np.int64),
        "optimizer_step": rows["step"].astype(np.int64),
        "examples_seen": _step_axis(reader, rows["step"], "examples_seen"),
        "epoch": _step_axis(reader, rows["step"], "epoch"),
        "micro_batch": rows["micro_batch"].astype(np.int64),
        "site": site_names[rows["site"]],
        "module_type": site_types[rows["site"]],
        "stream": names_of(Stream, rows["stream"]),
        "phase": names_of(Phase, rows["phase"]),
    }
    presence = names_of(Presence, rows["presence"])
    if wide:
        cols["presence"] = presence
        for i, name in enumerate(SPINE_FIELDS):
            cols[name] = spine[:, i]
        return cols
    k = len(SPINE_FIELDS)
    tidy = {name: np.repeat(col, k) for name, col in cols.items()}
    tidy["field"] = np.tile(np.array(SPINE_FIELDS, dtype=object), len(rows))
    tidy["value"] = spine.reshape(-1)
    tidy["presence"] = np.repeat(presence, k)
    return tidy


def to_pandas(reader: Any, wide: bool = False) -> Any:
    """:func:`frame_columns` as a ``pandas.DataFrame`` (extra ``pandas``)."""
    pd = require_extra("pandas", "pandas", "Run.to_pandas()")
    return pd.DataFrame(frame_columns(reader, wide))


def _listed(col: np.ndarray) -> Any:
    return col.tolist() if col.dtype == object else col


def to_polars(reader: Any, wide: bool = False) -> Any:
    """:func:`frame_columns` as a ``polars.DataFrame`` (extra ``polars``)."""
    pl = require_extra("polars", "polars", "Run.to_polars()")
    return pl.DataFrame({k: _listed(v) for k, v in frame_columns(reader, wide).items()})


def to_arrow(reader: Any, wide: bool = False) -> Any:
    """:func:`frame_columns` as a ``pyarrow.Table`` (extra ``arrow``)."""
    pa = require_extra("pyarrow", "arrow", "Run.to_arrow()")
    return pa.table({k: pa.array(_listed(v)) for k, v in frame_columns(reader, wide).items()})


def series_text(series: Any, limit: int = 12) -> str:
    """``print(series)``: a header (what, how many values, the cadence) and a step/value table.

    >>> from stepscope.history import Series
    >>> s = Series("zero", np.array([0, 10]), np.array([7561.0, 5239.0]), np.ones(2, np.uint8),
    ...            np.ones(2, bool), np.zeros(2, np.int32), name="1", stream="activation",
    ...            cadence=10)
    >>> print(s)
    Series '1' activation zero: 2 values at steps 0..10 (activation cadence: every 10 steps; ...)
     step  value
        0   7561
       10   5239
    """
    what = " ".join(x for x in (repr(series.name) if series.name else "", series.stream) if x)
    n = len(series.steps)
    span = f" at steps {series.steps[0]}..{series.steps[-1]}" if n else ""
    head = f"Series {what + ' ' if what else ''}{series.field}: {n} values{span}"
    if series.cadence is not None:
        every = "every step" if series.cadence == 1 else f"every {series.cadence} steps"
        hint = "" if series.cadence == 1 else "; cadence=1 records every step"
        head += f" ({series.stream} cadence: {every}{hint})"
    presence = series.presence_names()
    cells = [
        (str(int(st)), f"{float(v):.8g}" if ok else f"nan ({p})")
        for st, v, ok, p in zip(series.steps, series.values, series.valid, presence)
    ]
    if n > limit:
        half = limit // 2
        cells = [*cells[:half], ("...", "..."), *cells[-half:]]
    w0 = max([4, *(len(a) for a, _ in cells)])
    w1 = max([5, *(len(b) for _, b in cells)])
    lines = [head, f" {'step':>{w0}}  {'value':>{w1}}"]
    lines += [f" {a:>{w0}}  {b:>{w1}}" for a, b in cells]
    return "\n".join(lines)


def series_frame(series: Any) -> Any:
    """``series.to_pandas()``: a ``pandas.DataFrame`` of ``step``, ``value``, ``presence``."""
    pd = require_extra("pandas", "pandas", "Series.to_pandas()")
    cols = {"step": series.steps, "value": series.values, "presence": series.presence_names()}
    return pd.DataFrame(cols)


def site_int_refusal(site: int, sites: Any) -> Refusal:
    """``history_site_name_required`` for a bare int given as a site (names are strings).

    ``h.series(1, ...)`` once meant site id 1 (e.g. ``0.bias``) where the user meant the module
    named ``"1"``; a site is a name (``"1"``) or a :class:`~stepscope.history.SiteRecord`.
    """
    named = [s for s in sites if s.name == str(site)]
    by_id = [s for s in sites if s.site_id == site]
    remedies = [f"pass the site's name as a string: series({str(site)!r}, ...)"] if named else []
    if by_id:
        remedies.append(f"or the record with that id: series(reader.sites[{site}], ...)")
    remedies.append("list the sites with `stepscope show RUN` or [s.name for s in reader.sites]")
    return Refusal(
        "history_site_name_required",
        f"site {site!r} is an int; sites are named by strings"
        + (f" (site {str(site)!r} is a {named[0].module_type})" if named else "")
        + ".",
        remedies,
    )


def series_label(reader: Any, site: Any, stream: Any) -> dict[str, Any]:
    """What a :class:`~stepscope.history.Series` of ``site`` and ``stream`` says it is:
    ``name``, ``stream`` (its value) and ``cadence`` (the run's spine cadence of the stream)."""
    name = site if isinstance(site, str) else getattr(site, "name", str(site))
    value = getattr(stream, "value", str(stream))
    cadence = reader.run.cadences.get(value)
    return {"name": name, "stream": value, "cadence": cadence if isinstance(cadence, int) else None}

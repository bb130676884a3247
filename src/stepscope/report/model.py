"""The report's document model: sections holding plots, tables and "no data recorded" notes.

The report reads each run as a :class:`~stepscope.run.Run` (:func:`stepscope.open_run`), named
by :func:`run_label` and grouped by :func:`recipe_of`. A section has a short summary (``items``,
shown open) and ``details`` (folded in the page under a ``<details>`` element); builders choose
which is which. A new section is a function returning a
:class:`Section` with a stable ``key``, added to the report's builder list
(:func:`stepscope.report.html.build_sections`).

Example
-------
>>> s = Section("record", "Run record", [Note("no data recorded: nothing measured")])
>>> s.has_data
False
>>> s.details.append(Table("t", ["a"], [["1"]]))
>>> s.has_data, len(s.all_items)
(True, 2)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stepscope.report.plots import Plot
from stepscope.run import Run


@dataclass(frozen=True)
class Note:
    """A labelled statement in place of a plot (e.g. ``no data recorded: ...``)."""

    text: str


@dataclass(frozen=True)
class Table:
    """A small table of strings."""

    title: str
    header: list[str]
    rows: list[list[str]]


Item = Plot | Table | Note


@dataclass
class Section:
    """One report section: a stable ``key`` (the HTML id), a title and its items."""

    key: str
    title: str
    items: list[Item] = field(default_factory=list)
    details: list[Item] = field(default_factory=list)

    @property
    def all_items(self) -> list[Item]:
        """The summary items, then the folded details."""
        return [*self.items, *self.details]

    @property
    def has_data(self) -> bool:
        """Whether anything other than notes was drawn (summary or details)."""
        return any(not isinstance(i, Note) for i in self.all_items)


#: Prefix of every absent-data note.
NO_DATA = "no data recorded: "


def no_data(what: str, looked_for: str, how: str = "") -> Note:
    """The standard absent-data note: what is missing, what the report looked for and (``how``)
    how a run records it.

    >>> no_data("curvature", "RUN/curvature/*.json", "run `stepscope curvature`").text
    'no data recorded: curvature (looked for RUN/curvature/*.json; run `stepscope curvature`).'
    """
    return Note(f"{NO_DATA}{what} (looked for {looked_for}{'; ' + how if how else ''}).")


#: Run-record ``extra`` keys naming a run's recipe (the report's seed groups), in priority order.
GROUP_KEYS: tuple[str, ...] = ("recipe", "variant")


def run_label(run: Run) -> str:
    """A run's name in the report: its run id, with its seed where the run record has one."""
    seed = run.run.extra.get("seed")
    return run.run.run_id if seed is None else f"{run.run.run_id} (seed {seed})"


def recipe_of(run: Run) -> str:
    """A run's recipe group: the first of :data:`GROUP_KEYS` in the run record's ``extra``.

    Runs of different recipes are never averaged together (``""``: no recipe recorded).
    """
    extra = run.run.extra
    return next((str(extra[k]) for k in GROUP_KEYS if extra.get(k) is not None), "")


def one_per_recipe(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """``(shown, left_out)``: the first run of each recipe group, and the other seeds.

    Per-run panels (heatmaps, confusion matrices, spectra) are drawn for one seed per recipe;
    the seeds' spread is in the curves' bands, and a note names the runs left out.
    """
    seen: set[str] = set()
    shown: list[Run] = []
    left: list[Run] = []
    for r in runs:
        (left if recipe_of(r) in seen else shown).append(r)
        seen.add(recipe_of(r))
    return shown, left


def left_out_note(what: str, left: list[Run]) -> Note | None:
    """The note naming the seeds whose per-run panels were not drawn (``None`` if none)."""
    if not left:
        return None
    names = ", ".join(run_label(r) for r in left)
    return Note(
        f"{what}: drawn for the first run of each recipe; not drawn for {names} "
        "(report those runs alone, or pass --every-seed, to see them)."
    )


#: Significant digits of a float in a report table.
SIGNIFICANT_DIGITS = 4


def fmt(value: object) -> str:
    """A compact string for a table cell (``None`` -> ``not recorded``), floats rounded.

    >>> fmt(0.123456789), fmt(1234567.0), fmt(14.0), fmt(None), fmt(-0.0)
    ('0.1235', '1.235e+06', '14', 'not recorded', '0')
    """
    if value is None:
        return "not recorded"
    if isinstance(value, float):
        return f"{value + 0.0:.{SIGNIFICANT_DIGITS}g}"  # + 0.0: no "-0"
    return str(value)


def fmt_unix(seconds: float | None) -> str:
    """A Unix time as a UTC date and time (``None`` or 0 -> ``not recorded``).

    >>> fmt_unix(1796030000.0)
    '2026-11-30 09:13:20 UTC'
    """
    if not seconds:
        return "not recorded"

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))

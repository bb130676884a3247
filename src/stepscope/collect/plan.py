"""The plan table: what a collector reduces, how often, and what a logged step costs.

Example
-------
>>> import torch, stepscope as ss
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 2))
>>> c = ss.HistoryCollector(model, sites="Linear", streams=("parameter",))
>>> print(c.plan())  # doctest: +NORMALIZE_WHITESPACE
site      stream     spine every  hist every  elements/step  bytes/step
--------  ---------  -----------  ----------  -------------  -----------------
0.weight  parameter  10           100         8              120 (+4,160 hist)
0.bias    parameter  10           100         2              120 (+4,160 hist)
TOTAL     2 rows                              10             240
>>> c.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.stats import SPINE_WIDTH


@dataclass(frozen=True)
class PlanRow:
    """One (site, stream) row.

    ``elements`` is the number of elements reduced per logged step (``None`` until the first
    forward reveals an activation's shape); ``bytes_spine`` / ``bytes_histogram`` are the bytes
    stored per logged step for the spine row and, on histogram steps, the histogram row.
    """

    site: str
    stream: str
    spine_every: str
    histogram_every: str
    elements: int | None
    bytes_spine: int
    bytes_histogram: int
    estimated: bool


@dataclass(frozen=True)
class Plan:
    """Rows plus totals; ``str(plan)`` is a readable table."""

    rows: tuple[PlanRow, ...]
    #: live rank merge: (bytes each rank sends per logged spine step, world size); None: off
    live_merge: tuple[int, int] | None = None

    @property
    def total_elements(self) -> int | None:
        """Reduced elements per step when every stream is due (``None`` if any is undiscovered)."""
        if any(r.elements is None for r in self.rows):
            return None
        return sum(r.elements for r in self.rows)  # type: ignore[misc]

    @property
    def total_bytes_spine(self) -> int:
        return sum(r.bytes_spine for r in self.rows)

    def __str__(self) -> str:
        head = ("site", "stream", "spine every", "hist every", "elements/step", "bytes/step")
        body = [
            (
                r.site,
                r.stream,
                r.spine_every,
                r.histogram_every,
                "?"
                if r.elements is None
                else f"{r.elements:,}" + (" (sample)" if r.estimated else ""),
                f"{r.bytes_spine:,} (+{r.bytes_histogram:,} hist)",
            )
            for r in self.rows
        ]
        total_el = self.total_elements
        body.append(
            (
                "TOTAL",
                f"{len(self.rows)} rows",
                "",
                "",
                "? (run one forward)" if total_el is None else f"{total_el:,}",
                f"{self.total_bytes_spine:,}",
            )
        )
        widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
        line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
        lines = [line(head), line(["-" * w for w in widths]), *map(line, body)]
        if self.live_merge is not None:
            sent, world = self.live_merge
            lines.append(
                f"live merge: 1 gather per logged step, {sent:,} bytes/rank "
                f"({sent * world:,} received by rank 0 of {world}; + histogram rows on "
                "histogram steps), independent of tensor sizes"
            )
        return "\n".join(lines)


def build_plan(
    rows: Sequence,
    cadences: dict,
    histogram_width: int,
    sample_size: int,
    live_merge: tuple[int, int] | None = None,
) -> Plan:
    """Make the plan from the collector's rows and resolved cadences."""
    out = []
    for r in rows:
        c = cadences[r.stream]
        d = c.describe()
        elements = r.numel
        estimated = False
        if r.stream == "update" and elements is not None and elements > sample_size:
            elements, estimated = sample_size, True
        out.append(
            PlanRow(
                site=r.site,
                stream=r.stream,
                spine_every=str(d["spine"]),
                histogram_every=str(d["histogram"]),
                elements=elements,
                bytes_spine=SPINE_WIDTH * 8,
                bytes_histogram=histogram_width * 8 if c.histogram else 0,
                estimated=estimated,
            )
        )
    return Plan(tuple(out), live_merge)

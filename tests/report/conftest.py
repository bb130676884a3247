"""Session fixtures for the report tests (the kit lives in ``report_testkit.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report.report_testkit import bare_run, train_run


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Two seeds of the full run plus a bare run, built once per session."""
    root = tmp_path_factory.mktemp("report-runs")
    out: dict[str, object] = {}
    for seed in (0, 1):
        p = root / f"seed{seed}"
        out[f"truth{seed}"] = train_run(p, seed)
        out[f"seed{seed}"] = p
    bare_run(root / "bare")
    out["bare"] = root / "bare"
    out["root"] = root
    return out


@pytest.fixture(scope="session")
def report(runs: dict[str, object]) -> dict[str, object]:
    """The report over both seeds, built once: sections (with plot data) and the HTML file."""
    from stepscope.report import ReportRun, build_sections, write_report

    views = [ReportRun.open(runs["seed0"]), ReportRun.open(runs["seed1"])]
    sections = build_sections(views, histogram_limit=3)
    path = write_report(sections, views, Path(runs["root"]) / "report.html")
    return {"views": views, "sections": {s.key: s for s in sections}, "path": path}

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
    from stepscope import open_run
    from stepscope.report import build_sections, write_report

    views = [open_run(runs["seed0"]), open_run(runs["seed1"])]
    sections = build_sections(views, histogram_limit=3)
    path = write_report(sections, views, Path(runs["root"]) / "report.html")
    return {"views": views, "sections": {s.key: s for s in sections}, "path": path}


@pytest.fixture(scope="session")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``stepscope demo --quick`` once per session (two recipes, one seed each): its report."""
    import io

    from stepscope.demo.study import StudyConfig, run_study

    out = tmp_path_factory.mktemp("demo-quick")
    result = run_study(StudyConfig(quick=True, out_dir=str(out)), stream=io.StringIO())
    assert result.report is not None
    return Path(result.report)


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README quickstart (20 steps, every site, default settings): no probe, no evaluation,
    no curvature, no branch masks — what a first run records."""
    import torch

    import stepscope as ss

    root = tmp_path_factory.mktemp("quickstart")
    path = root / "a"
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    settings = ss.WatchSettings(output_dir=str(path))
    with ss.HistoryCollector(model, sites="*", settings=settings) as c:
        for x, y in [(torch.rand(64, 784), torch.randint(0, 10, (64,)))] * 20:
            with c.step(opt, examples=len(y), epoch=0) as st:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                st.log("loss", loss)
    return next(m.parent for m in root.rglob("manifest.json"))  # however the run dir is named

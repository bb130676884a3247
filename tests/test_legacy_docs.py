"""The legacy metric notes cited by the code and docs are in the repository and cover the
legacy names our outputs map to."""

from __future__ import annotations

import re
from pathlib import Path

from stepscope.probe.legacy import legacy_names

PROBE_LEGACY = legacy_names("probe")
CURVATURE_LEGACY = legacy_names("curvature")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "LEGACY_METRICS.md"


def test_every_citation_of_the_legacy_notes_resolves():
    assert DOC.is_file()
    citing = [
        p
        for p in [*ROOT.glob("src/**/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md"]
        if p != DOC and "LEGACY_METRICS.md" in p.read_text(encoding="utf-8")
    ]
    assert citing  # the code does cite it
    for p in citing:
        for ref in re.findall(r"[\w./-]*LEGACY_METRICS\.md", p.read_text(encoding="utf-8")):
            candidates = [ROOT / ref, p.parent / ref]
            assert any(c.resolve() == DOC for c in candidates), (p, ref)


def test_the_notes_define_each_legacy_name_we_map_to():
    text = DOC.read_text(encoding="utf-8")
    names = {legacy.name.split("/")[-1] for legacy in PROBE_LEGACY.values()}
    names |= {"hess_curv", "jac_curv", "norms_hess", "norms_jac", "kfac_error", "diag_trace"}
    missing = sorted(n for n in names if n not in text)
    assert not missing, missing
    assert "gradient_diversity_legacy_scale" in text  # both diversity conventions are named
    assert any("mismatch/rho" in v.name for v in CURVATURE_LEGACY.values())
    assert "mismatch/rho" in text


def test_one_legacy_table_feeds_both_producers_records():
    """The probe's record and the curvature result carry the views of the one table."""
    import torch

    import stepscope as ss
    from stepscope.probe.legacy import LEGACY_NAMES, OMITTED_LEGACY

    assert set(PROBE_LEGACY) | set(CURVATURE_LEGACY) == set(LEGACY_NAMES)
    assert not set(PROBE_LEGACY) & set(CURVATURE_LEGACY)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    rec = ss.DenseProbe(x, y, size=8).measure(model, step=0, examples_seen=0, epoch=0).to_dict()
    assert rec["legacy_names"] == {
        k: {"legacy_name": v.name, "relation": v.relation} for k, v in PROBE_LEGACY.items()
    }
    assert rec["omitted_legacy_names"] == list(OMITTED_LEGACY)
    meta = ss.analyze_curvature(model, x, y, eig_max_dimension=64)["metadata"]
    assert meta["legacy_names"] == {k: v.describe() for k, v in CURVATURE_LEGACY.items()}
    assert meta["legacy_names"]["layers.*.{family}.kfac.trace"] == (
        "layer-{i}/{family}/kfac_trace (legacy used unnormalised sums)"
    )
    assert meta["omitted_legacy_quantities"] == OMITTED_LEGACY

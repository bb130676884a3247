"""The legacy metric notes cited by the code and docs are in the repository and cover the
legacy names our outputs map to."""

from __future__ import annotations

import re
from pathlib import Path

from stepscope.curvature.analyze import LEGACY_NAMES as CURVATURE_LEGACY
from stepscope.probe import LEGACY_NAMES as PROBE_LEGACY

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
    names = {legacy.split("/")[-1] for legacy, _ in PROBE_LEGACY.values()}
    names |= {"hess_curv", "jac_curv", "norms_hess", "norms_jac", "kfac_error", "diag_trace"}
    missing = sorted(n for n in names if n not in text)
    assert not missing, missing
    assert "gradient_diversity_legacy_scale" in text  # both diversity conventions are named
    assert any("mismatch/rho" in v for v in CURVATURE_LEGACY.values()) and "mismatch/rho" in text

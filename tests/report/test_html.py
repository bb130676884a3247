"""The HTML file: every section present, every image an embedded PNG that decodes, absent data
labelled as such, every plot naming its x-axis; the CLI and its refusals."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

import pytest

import stepscope as ss
from stepscope.cli import main
from stepscope.report import SECTION_KEYS, render_report
from tests.report.report_testkit import decode_png


class ReportParser(HTMLParser):
    """Collects, per section id: image sources, figcaptions and no-data notes."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: dict[str, dict[str, list[str]]] = {}
        self.current: str | None = None
        self.capture: str | None = None
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" or (tag == "div" and a.get("id") == "not-recorded"):
            self.current = a["id"]
            self.sections[self.current] = {"img": [], "caption": [], "nodata": []}
        elif tag == "img" and self.current:
            self.sections[self.current]["img"].append(a["src"] or "")
        elif tag == "figcaption":
            self.capture = "caption"
        elif tag == "p" and a.get("class") in ("nodata", "missing"):
            self.capture = "nodata"
        if tag in ("link", "script") or (tag == "img" and not (a["src"] or "").startswith("data:")):
            self.external.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("figcaption", "p"):
            self.capture = None
        if tag == "section" or (tag == "div" and self.current == "not-recorded"):
            self.current = None

    def handle_data(self, data: str) -> None:
        if self.capture and self.current:
            self.sections[self.current][self.capture].append(data)


def parse(path: Path) -> ReportParser:
    p = ReportParser()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_every_section_is_present_and_every_image_is_an_embedded_png_that_decodes(report):
    p = parse(report["path"])
    # the kit's runs record every section but the flight recorder's (tests/report/test_spikes.py),
    # which folds into the one "not recorded" line at the top
    assert list(p.sections) == ["not-recorded", *(k for k in SECTION_KEYS if k != "spikes")]
    assert p.external == []  # self-contained: no scripts, stylesheets or linked images
    images = [src for s in p.sections.values() for src in s["img"]]
    assert len(images) >= 30
    prefix = "data:image/png;base64,"
    for src in images:
        assert src.startswith(prefix)
        decode_png(base64.b64decode(src[len(prefix) :], validate=True))
    for key in ("curves", "branch", "endpoints", "layers", "moments", "histograms", "curvature"):
        assert p.sections[key]["img"], key


def test_every_plot_names_its_x_axis(report):
    p = parse(report["path"])
    captions = [c for s in p.sections.values() for c in s["caption"]]
    assert len(captions) == sum(len(s["img"]) for s in p.sections.values())
    assert all(c.startswith("x-axis: ") and len(c) > len("x-axis: x.") for c in captions)


def test_absent_sections_are_labelled_notes_without_any_plot(runs, tmp_path):
    out = render_report([runs["bare"]], tmp_path / "bare.html")
    text = out.read_text(encoding="utf-8")
    p = parse(out)
    drawn = [k for k in SECTION_KEYS if k in p.sections]
    assert list(p.sections) == ["not-recorded", *drawn]  # the empty ones: one line on top
    for key in SECTION_KEYS:
        assert f'id="{key}"' in text, key  # a section or an anchor in the not-recorded line
    top = " ".join(p.sections["not-recorded"]["nodata"])
    for key in ("moments", "curvature"):
        assert key not in p.sections, key
    for what in ("per-example gradient moments", "curvature"):
        assert what in top, what
    # branch: throughput is measured from the step clock; the absent branch rows in one line
    assert "branch activity" in " ".join(p.sections["branch"]["nodata"])
    # curves: no probe/eval rows; only the clocks (elapsed beside training time) are drawn
    assert "probe or validation CE/accuracy" in " ".join(p.sections["curves"]["nodata"])
    assert len(p.sections["curves"]["img"]) == 1
    # layers: the activation stream exists, the four other quantities and the (absent) dense
    # probe's Plot 3 are named as absent, in one line
    assert len(p.sections["layers"]["img"]) == 1
    (line,) = p.sections["layers"]["nodata"]
    assert line.count("(looked for") == 5 and "dense-probe layer heatmaps" in line
    assert "measured overhead" in " ".join(p.sections["record"]["nodata"])


def test_cli_writes_the_report_and_refuses_bad_endpoints(runs, tmp_path, capsys):
    out = tmp_path / "sub" / "cli.html"
    assert main(["report", str(runs["bare"]), "--out", str(out), "--histogram-limit", "1"]) == 0
    assert "histograms" in parse(out).sections
    assert main(["report", str(runs["bare"]), "--out", str(out), "--endpoints", "a,b"]) == 3
    assert "report_input_invalid" in capsys.readouterr().err


def test_refusals_have_codes(tmp_path):
    with pytest.raises(ss.Refusal) as err:
        render_report([], tmp_path / "x.html")
    assert err.value.code == "report_input_invalid"
    with pytest.raises(ss.Refusal) as err:
        render_report([tmp_path / "missing"], tmp_path / "x.html")
    assert err.value.code == "history_artifact_missing"
    assert not (tmp_path / "x.html").exists()


def test_a_quickstart_report_opens_on_what_was_recorded_and_lists_the_rest_in_one_line(
    quickstart_run, tmp_path
):
    import re

    out = render_report([quickstart_run], tmp_path / "qs.html")
    text = out.read_text(encoding="utf-8")
    p = parse(out)
    # the first section drawn holds plots (the training loss), not a "no data" banner
    first = next(k for k in p.sections if k != "not-recorded")
    assert first == "curves" and p.sections[first]["img"], list(p.sections)
    for body in re.findall(r"<section .*?</section>", text, re.S):  # plots first, then the gaps
        if "<img " in body and 'class="missing"' in body:
            assert body.index("<img ") < body.index('class="missing"')
    # what the quickstart does not record: one line near the top, naming how to record it
    found = re.search(r'<div id="not-recorded">(.*?)</div>', text, re.S)
    assert found, "no not-recorded line"
    line = re.sub(r"<[^>]+>", "", found.group(1))
    assert line.startswith("Not recorded: ") and line.count("\n") == 0
    for what in ("per-example gradient moments", "curvature", "DenseProbe"):
        assert what in line, what
    assert "branch activity" in " ".join(p.sections["branch"]["nodata"])
    assert text.index('id="not-recorded"') < text.index("<section")
    for key in SECTION_KEYS:  # every section id still resolves (a section or an anchor)
        assert f'id="{key}"' in text, key
    assert "moments" not in p.sections and "curvature" not in p.sections
    # drawn: histograms of every site's streams, folded after the first (8 panels at most)
    images = re.findall(r"<img ", text)
    assert 1 <= len(p.sections["histograms"]["img"]) <= 8 and len(images) <= 30

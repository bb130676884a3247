"""The report in a real browser: headless Chromium loads it, every image decodes to its PNG size,
and a screenshot is taken. Skipped (with the reason) where no Chromium is installed."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest

from tests.report.report_testkit import decode_png

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason=f"no Chromium found on PATH (looked for {', '.join(BROWSERS)}); "
    "install it (Debian: apt-get install -y chromium) to run the browser check",
)

# Runs after every image has loaded or failed; the verdict is written into the DOM.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = Array.from(document.images);
  const sizes = imgs.map(i => (i.complete && i.naturalWidth > 0) ? [i.naturalWidth, i.naturalHeight]
                                                                 : null);
  document.body.setAttribute('data-image-sizes', JSON.stringify(sizes));
});
</script>"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    cmd += ["--disable-background-networking"]
    cmd += ["--hide-scrollbars", "--virtual-time-budget=20000", *args]
    return subprocess.run(cmd, capture_output=True, timeout=180)


def test_every_image_loads_in_chromium_at_its_png_size_and_a_screenshot_is_taken(report, tmp_path):
    html = report["path"].read_text(encoding="utf-8")
    srcs = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', html)
    want = [list(decode_png(base64.b64decode(s))) for s in srcs]
    assert len(want) >= 15
    page = tmp_path / "report.html"
    page.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")

    done = chromium("--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout.decode("utf-8", "replace")
    found = re.search(r"data-image-sizes=\"([^\"]*)\"", dom)
    assert found, "the load handler did not run"
    sizes = json.loads(found.group(1).replace("&quot;", '"'))
    assert sizes == want  # every image loaded (none is null) and decoded to its IHDR size

    shot = tmp_path / "report.png"
    done = chromium("--window-size=1280,2400", f"--screenshot={shot}", report["path"].as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert decode_png(shot.read_bytes()) == (1280, 2400)


# Measures horizontal overflow after layout: the page, and every element that sticks out of it.
# The verdict goes into the DOM and, when the report sits in a frame, to the parent page.
LAYOUT_PROBE = """<script>
window.addEventListener('load', () => {
  const doc = document.documentElement;
  const over = Array.from(document.querySelectorAll('body *'))
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
                 && !e.closest('.scroll'))  // inside a horizontal scroller is fine
    .slice(0, 5).map(e => e.tagName + '.' + e.className);
  const verdict = JSON.stringify({inner: window.innerWidth, scroll: doc.scrollWidth, over: over});
  document.body.setAttribute('data-layout', verdict);
  if (window.parent !== window) window.parent.postMessage(verdict, '*');
});
</script>"""

# A phone-width frame: headless Chromium will not open a window narrower than 500 px.
FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe src="{src}" style="width:{width}px;height:900px;border:0"></iframe>
<script>window.addEventListener('message', e => document.body.setAttribute('data-layout', e.data));
</script></body></html>"""


@pytest.mark.parametrize("width", [1280, 390])  # a desktop and a phone (iPhone 12-15 width)
def test_no_horizontal_overflow_at_desktop_and_phone_widths(report, tmp_path, width):
    html = report["path"].read_text(encoding="utf-8")
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    page = tmp_path / "report.html"
    page.write_text(html.replace("</body>", LAYOUT_PROBE + "</body>"), encoding="utf-8")
    if width >= 500:
        done = chromium(f"--window-size={width},900", "--dump-dom", page.as_uri())
    else:
        frame = tmp_path / "frame.html"
        frame.write_text(FRAME.format(src=page.name, width=width), encoding="utf-8")
        done = chromium("--window-size=800,900", "--dump-dom", frame.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout.decode("utf-8", "replace")
    found = re.search(r"data-layout=\"([^\"]*)\"", dom)
    assert found, "the load handler did not run"
    layout = json.loads(found.group(1).replace("&quot;", '"'))
    assert layout["inner"] == width
    assert layout["scroll"] <= width and layout["over"] == [], layout
    if width >= 500:
        shot = tmp_path / f"report-{width}.png"
        done = chromium(f"--window-size={width},1800", f"--screenshot={shot}", page.as_uri())
        assert done.returncode == 0 and decode_png(shot.read_bytes()) == (width, 1800)


# What a reader sees: page height, horizontal overflow, and each image shown (not folded away
# in a closed <details>) with its displayed width over its own CSS width.
VIEW_PROBE = """<script>
window.addEventListener('load', () => {
  const doc = document.documentElement;
  const shown = Array.from(document.images).filter(i => !i.closest('details:not([open])'));
  const verdict = JSON.stringify({
    inner: window.innerWidth, height: doc.scrollHeight, scroll: doc.scrollWidth,
    scales: shown.map(i => i.getBoundingClientRect().width / Number(i.getAttribute('width'))),
    folded: document.querySelectorAll('details:not([open]) img').length,
    first: (document.querySelector('section') || {}).id || null});
  document.body.setAttribute('data-view', verdict);
  if (window.parent !== window) window.parent.postMessage(verdict, '*');
});
</script>"""
SCREEN = {1280: 900, 390: 844}  # a laptop window and a phone's visible height (iPhone 12-15)


def view(path, tmp_path, width: int) -> dict:
    page = tmp_path / f"view-{width}.html"
    page.write_text(path.read_text(encoding="utf-8").replace("</body>", VIEW_PROBE + "</body>"))
    if width >= 500:
        done = chromium(f"--window-size={width},{SCREEN[width]}", "--dump-dom", page.as_uri())
    else:  # headless Chromium lays out no narrower than 500 px: measure in a phone-wide frame
        frame = tmp_path / f"frame-{width}.html"
        frame.write_text(FRAME.format(src=page.name, width=width), encoding="utf-8")
        done = chromium("--window-size=800,900", "--dump-dom", frame.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'data-(?:view|layout)="([^"]*)"', done.stdout.decode("utf-8", "replace"))
    assert found, "the load handler did not run"
    return json.loads(found.group(1).replace("&quot;", '"'))


@pytest.mark.slow  # one `stepscope demo --quick` per session, shared by the tests below
@pytest.mark.parametrize("width", [1280, 390])
def test_the_demo_report_is_small_a_few_screens_tall_and_readable_on_a_phone(
    demo_report, tmp_path, width
):
    from stepscope.report.figure import DPI, MIN_FONT

    assert demo_report.stat().st_size <= 5_000_000  # bytes; the demo's report was 33.6 MB
    v = view(demo_report, tmp_path, width)
    assert v["inner"] == width
    assert v["scroll"] <= width, v  # no horizontal overflow
    screens = v["height"] / SCREEN[width]
    assert screens <= (6 if width > 500 else 12), f"{screens:.1f} screens tall"
    assert v["folded"] > 0  # details are folded, summaries open
    assert v["first"] == "curves"
    # plot text: the smallest font (MIN_FONT pt at DPI) at the scale the page shows the images
    assert min(v["scales"]) >= 0.8, v["scales"]
    assert MIN_FONT / 72 * DPI * min(v["scales"]) >= 9.0  # CSS px
    shot = tmp_path / f"demo-{width}.png"
    done = chromium(f"--window-size={width},{SCREEN[width]}", f"--screenshot={shot}",
                    demo_report.as_uri())  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert decode_png(shot.read_bytes()) == (width, SCREEN[width])

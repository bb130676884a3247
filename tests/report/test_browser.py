"""The report in a real browser: headless Chromium loads it, every image decodes to its PNG size,
and a screenshot is taken. Skipped (with the reason) where no Chromium is installed."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess

import pytest
from report_testkit import decode_png

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
    cmd += ["--hide-scrollbars", "--virtual-time-budget=20000", *args]
    return subprocess.run(cmd, capture_output=True, timeout=180)


def test_every_image_loads_in_chromium_at_its_png_size_and_a_screenshot_is_taken(report, tmp_path):
    html = report["path"].read_text(encoding="utf-8")
    srcs = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', html)
    want = [list(decode_png(base64.b64decode(s))) for s in srcs]
    assert len(want) >= 30
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

"""Regenerate the README's report screenshot from the current code, in headless Chromium.

``python -m benchmarks.report_screenshot`` trains ``stepscope demo --quick`` into a temporary
directory (or reads ``--runs DIR``, a folder of demo runs), renders the report with the current
code and photographs its first screen at 1280 x 900 into ``docs/images/report.png`` and at a
390 x 844 phone size into ``docs/images/report-phone.png``. It prints the report's size, the
page height in screens and the command line. Chromium: ``apt-get install -y chromium``.

Example
-------
>>> from benchmarks.report_screenshot import SHOTS
>>> SHOTS["report.png"]
(1280, 900)
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: File name under docs/images -> (width, height) of the window photographed.
SHOTS = {"report.png": (1280, 900), "report-phone.png": (390, 844)}
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def browser() -> str:
    """The first Chromium on PATH, else exit with the install line."""
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        sys.exit("no Chromium on PATH: apt-get install -y chromium (Debian)")
    return found


def screenshot(page: Path, out: Path, width: int, height: int) -> None:
    """Photograph ``page`` in a ``width`` x ``height`` headless window into ``out``."""
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
    cmd += ["--disable-background-networking", "--hide-scrollbars", "--virtual-time-budget=20000"]
    cmd += [f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=180)


def demo_runs(root: Path) -> list[Path]:
    """The run directories (holding ``manifest.json``) under ``root``, sorted."""
    return sorted(m.parent for m in root.rglob("manifest.json"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=Path, help="a folder of demo runs (default: train --quick)")
    p.add_argument("--out", type=Path, default=IMAGES, help="folder for the PNGs")
    args = p.parse_args(argv)
    from stepscope.report import render_report

    with tempfile.TemporaryDirectory() as tmp:
        root = args.runs
        if root is None:
            from stepscope.demo.study import StudyConfig, run_study

            root = Path(tmp) / "demo"
            run_study(StudyConfig(quick=True, out_dir=str(root), report=False), io.StringIO())
        runs = demo_runs(root)
        overlay = root / "overlay-example.json"
        page = Path(tmp) / "report.html"
        render_report(runs, page, overlays=[overlay] if overlay.exists() else [])
        args.out.mkdir(parents=True, exist_ok=True)
        for name, (w, h) in SHOTS.items():
            screenshot(page, args.out / name, w, h)
            print(f"wrote {args.out / name} ({w} x {h})")
        size = page.stat().st_size
    print(f"report over {len(runs)} runs: {size / 1e6:.2f} MB")
    print(
        "command: python -m benchmarks.report_screenshot" + (f" --runs {root}" if args.runs else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

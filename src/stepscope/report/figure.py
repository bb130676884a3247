"""The report's figures: sized for the page, plain-text tick labels, compact PNG bytes.

Every plot of the report is drawn on a private matplotlib ``Figure`` from :func:`new_figure`
(no pyplot, no global backend switch) and turned into bytes by :func:`encode_png`, which

* draws all text literally (site and run names are data: ``$`` is a dollar sign, never math);
* gives every log-scaled axis (colourbars included) plain-text tick labels such as ``10⁻³`` and
  ``2×10⁻¹`` (with math text off, matplotlib's own log labels would print as
  ``$\\mathdefault{10^{-3}}$``);
* renders at :data:`PNG_SCALE` times the displayed size (sharp on HiDPI screens) and stores the
  pixels as an adaptive palette PNG (a few times smaller than RGBA, no visible loss on plots).

Sizes: a figure is :data:`FIG_WIDTH` inches wide at :data:`DPI`, i.e. about 400 CSS pixels, so a
390-px phone shows it at ~90 % and :data:`MIN_FONT` (9 pt = 11 px) stays ~9.5 px on screen.

Example
-------
>>> plain_tick("$\\\\mathdefault{10^{-3}}$"), plain_tick("$\\\\mathdefault{2\\\\times10^{1}}$")
('10⁻³', '2×10¹')
"""

from __future__ import annotations

import io
import re
from contextlib import AbstractContextManager
from typing import Any

from stepscope.errors import require_extra

#: Figure resolution (dots per inch) at the displayed size.
DPI = 90
#: PNGs hold this many pixels per displayed pixel (the HTML shows them at 1/PNG_SCALE size).
PNG_SCALE = 2
#: Width of an ordinary figure (inches): ``FIG_WIDTH * DPI`` CSS pixels on the page.
FIG_WIDTH = 4.4
#: Body text of the plots (axis labels, titles), pt.
FONT = 10
#: Smallest font size of any tick label, legend entry or annotation (pt).
MIN_FONT = 9
#: Colours kept in a PNG's palette (anti-aliased lines and colour maps need more than a few).
PALETTE_COLOURS = 160

_RC = {
    "font.size": FONT,
    "axes.titlesize": FONT,
    "axes.labelsize": FONT,
    "xtick.labelsize": MIN_FONT,
    "ytick.labelsize": MIN_FONT,
    "legend.fontsize": MIN_FONT,
    "figure.titlesize": FONT,
}

_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
_POWER = re.compile(r"\^\{(-?[0-9.]+)\}")


def plain_tick(text: str) -> str:
    """Matplotlib's math-text tick label as plain text (``10⁻³``, ``2×10¹``, ``−10²``).

    >>> plain_tick("$\\\\mathdefault{-10^{2}}$"), plain_tick("$\\\\mathdefault{0.5}$"), plain_tick("")
    ('−10²', '0.5', '')
    """
    s = text.strip()
    if s.startswith("$") and s.endswith("$"):
        s = s[1:-1]
    s = re.sub(r"\\mathdefault\{(.*)\}$", r"\1", s)
    s = s.replace("\\times", "×").replace("\\cdot", "·")
    s = _POWER.sub(lambda m: m.group(1).translate(_SUPERSCRIPT), s)
    return ("−" + s[1:]) if s.startswith("-") else s


def style() -> AbstractContextManager[Any]:
    """The report's font sizes for the artists created inside (``with style(): ...``)."""
    mpl = require_extra("matplotlib", "report", "drawing report plots")
    return mpl.rc_context(_RC)  # type: ignore[no-any-return]


def new_figure(
    width: float = FIG_WIDTH,
    height: float = 2.9,
    left: float = 0.75,
    right: float = 0.2,
    bottom: float = 0.55,
    top: float = 0.35,
) -> Any:
    """A private figure with fixed margins given in inches (``left``/``right``/...)."""
    mpl_figure = require_extra("matplotlib.figure", "report", "drawing report plots")
    require_extra("matplotlib.backends.backend_agg", "report", "rendering PNG plots")
    fig = mpl_figure.Figure(figsize=(width, height), dpi=DPI)
    # fixed margins: constrained layout measured at ~1 s per figure here, most of the render
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=bottom / height,
        top=1 - top / height,
        hspace=0.08,
    )
    return fig


def _plain_log_ticks(fig: Any) -> None:
    ticker = require_extra("matplotlib.ticker", "report", "drawing report plots")

    class PlainLogFormatter(ticker.LogFormatterSciNotation):  # type: ignore[misc,name-defined]
        """matplotlib's choice of labels on a log axis, written as plain text."""

        def __call__(self, x: float, pos: int | None = None) -> str:
            return plain_tick(super().__call__(x, pos))

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() == "log":
                axis.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
                minor = PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(1.0, 0.4))
                axis.set_minor_formatter(minor)


def encode_png(fig: Any) -> bytes:
    """The figure as palette-PNG bytes at ``PNG_SCALE`` x its displayed size (text literal)."""
    pil = require_extra("PIL.Image", "report", "compressing report plots")
    _plain_log_ticks(fig)
    for text in fig.findobj(lambda o: hasattr(o, "set_parse_math")):
        text.set_parse_math(False)  # names are data: "$" is a dollar sign, never math text
    buf = io.BytesIO()
    # bbox "tight": legends below the axes stay whole (matplotlib draws twice to find the box)
    fig.savefig(buf, format="png", dpi=DPI * PNG_SCALE, bbox_inches="tight", facecolor="white")
    image = pil.open(io.BytesIO(buf.getvalue())).convert("RGB")
    palette = image.quantize(
        colors=PALETTE_COLOURS, method=pil.Quantize.FASTOCTREE, dither=pil.Dither.NONE
    )
    out = io.BytesIO()
    palette.save(out, format="PNG", compress_level=7)
    return out.getvalue()

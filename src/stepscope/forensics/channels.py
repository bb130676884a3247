"""The flight recorder's channels: which per-site scalars it reads every step, and their names.

A *channel* is one number per step: a field of one site (``grad_rms`` of ``h.0.mlp.0.weight``)
or of the whole run (``loss``, ``grad_norm``). The recorder's RAM window and every window it
saves hold one column per channel, in the order of :func:`build_channels`.

Fields (every one the definition of one number, float64 on the host):

``grad_rms``
    :math:`\\lVert g \\rVert_2 / \\sqrt{n}` of the parameter's gradient as the optimizer read it
    (its step pre-hook), ``n`` its element count.
``update_rms``
    :math:`\\lVert \\Delta \\rVert_2 / \\sqrt{k}` of the update the optimizer applied
    (value after its step minus value before) on a seeded subvector of ``k`` elements (the
    collector's ``update_sample_size``; exact when it covers the parameter).
``update_ratio``
    :math:`\\lVert \\Delta \\rVert_2 / \\lVert p_{before} \\rVert_2` on that same subvector.
``param_rms``
    :math:`\\lVert p \\rVert_2 / \\sqrt{n}` of the whole parameter after the step.
``act_absmax``
    :math:`\\max |a|` of the site's output over the step's training forwards.
``loss`` (run)
    The user's logged loss of the step (the first of the :class:`LossSpike` keys present).
``grad_norm`` (run)
    :math:`\\sqrt{\\sum_p \\lVert g_p \\rVert_2^2}` over the parameters with a gradient.

A non-finite element makes its site's field non-finite (a norm or max over it), so the
``NonFinite`` trigger finds it exactly; counts are in the collector's dense rows after it.

>>> [c.label for c in build_channels(["fc.weight"], ["fc"], ("gradient",))]
['<run>/loss', '<run>/grad_norm', 'fc.weight/grad_rms']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LOG_FIELDS",
    "RECORDER_STREAMS",
    "RUN_SITE",
    "Channel",
    "build_channels",
]

#: The site name of run-wide channels (loss, total gradient norm).
RUN_SITE = "<run>"
#: The streams a recorder may read, and the fields each one gives.
RECORDER_STREAMS: Mapping[str, tuple[str, ...]] = {
    "gradient": ("grad_rms",),
    "update": ("update_rms", "update_ratio"),
    "parameter": ("param_rms",),
    "activation": ("act_absmax",),
}
#: Fields compared on a log scale (positive magnitudes; a loss is compared as it is).
LOG_FIELDS = frozenset({"grad_rms", "update_rms", "update_ratio", "param_rms", "act_absmax"})


@dataclass(frozen=True)
class Channel:
    """One column of the recorder's window: ``field`` of ``site`` (``stream`` it came from)."""

    site: str
    stream: str  # "run" for run-wide channels
    field: str

    @property
    def label(self) -> str:
        return f"{self.site}/{self.field}"

    def to_dict(self) -> dict[str, str]:
        return {"site": self.site, "stream": self.stream, "field": self.field}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Channel:
        return cls(str(d["site"]), str(d["stream"]), str(d["field"]))


def build_channels(
    params: Sequence[str], modules: Sequence[str], streams: Sequence[str]
) -> list[Channel]:
    """Run channels, then per parameter site its fields, then per activation site its field."""
    out = [Channel(RUN_SITE, "run", "loss"), Channel(RUN_SITE, "run", "grad_norm")]
    param_streams = [s for s in ("gradient", "update", "parameter") if s in streams]
    for name in params:
        for s in param_streams:
            out += [Channel(name, s, f) for f in RECORDER_STREAMS[s]]
    if "activation" in streams:
        out += [Channel(name, "activation", "act_absmax") for name in modules]
    return out

"""``stepscope.draw``: a profile's call tree drawn as an icicle, sized and coloured by time.

:func:`call_tree` folds the joined ops of a :class:`~stepscope.profile.results.ProfileResult`
into a tree keyed by the path of op names from the outermost op (``nn.Module: ...`` events,
``stepscope.region/...`` brackets, ``ProfilerStep#N`` and ``aten::`` ops alike, so the tree is the
module tree when the trace has module events, and the op graph otherwise). Repeated calls along
the same path are merged. Each :class:`CallNode` carries, per metric, its **self** time (time in
the node's own ops, not in a child op) and its **inclusive** time (self plus every descendant):

* ``device_time`` — device time joined to the op (``device_self_ns``; inclusive sums the
  subtree), available when the profile's device time is ``joined`` or ``partial``;
* ``cpu_time`` — host time (``cpu_self_ns``; inclusive sums the subtree).

stepscope's own work (``stepscope.internal/`` scopes, part (b) of the accounting) and ambiguous
launch groups are left out of the tree and named in the figure's note, never hidden in a parent.

:func:`draw` renders the tree as an icicle: one row per depth, each box as wide as its inclusive
``size_by`` time and coloured by its self ``color_by`` time (a sequential, colour-blind-safe
map), labelled with its name and both times where the box is wide enough. SVG or PNG (200 dpi)
by the file suffix. ``"auto"`` picks device time when it was joined and CPU time otherwise;
asking for ``device_time`` on a profile without it refuses ``device_time_unavailable``.

Example
-------
>>> import torch, stepscope as ss
>>> result = ss.kernel_profile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()),
...                            torch.randn(4, 8))
>>> tree = call_tree(result)
>>> tree.inclusive["cpu_time"] == tree.self_time["cpu_time"] + sum(
...     c.inclusive["cpu_time"] for c in tree.children)
True
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.errors import Refusal, require_extra
from stepscope.profile.results import Availability, ProfileResult

__all__ = ["DRAW_METRICS", "CallNode", "call_tree", "draw"]

#: Metrics a drawing can size or colour by (``auto``: device time when joined, else CPU time).
DRAW_METRICS = ("auto", "device_time", "cpu_time")
_METRICS = ("device_time", "cpu_time")


@dataclass
class CallNode:
    """One node of the call tree: a name path, its calls, and self/inclusive times per metric (ns)."""

    name: str
    depth: int
    calls: int = 0
    self_time: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_METRICS, 0))
    inclusive: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_METRICS, 0))
    children: list[CallNode] = field(default_factory=list)

    def walk(self) -> Iterator[CallNode]:
        """This node and every descendant, depth first."""
        yield self
        for child in self.children:
            yield from child.walk()


def _has_device(result: ProfileResult) -> bool:
    return result.availability in (Availability.PARTIAL, Availability.JOINED)


def _resolve(result: ProfileResult, metric: str, what: str) -> str:
    if metric not in DRAW_METRICS:
        raise Refusal(
            "profile_view_invalid", f"{what}={metric!r} is not one of {DRAW_METRICS}.", ["auto"]
        )
    if metric == "auto":
        return "device_time" if _has_device(result) else "cpu_time"
    if metric == "device_time":
        result.require_device_time()
    return metric


def call_tree(result: ProfileResult) -> CallNode:
    """The merged call tree of ``result``'s non-internal ops under a root named ``all``.

    Refuses ``profiler_session_inactive`` when the result holds no events.
    """
    join = result.require_device_time() if _has_device(result) else result._require_events()
    by_event = {op.event: op for op in join.ops}
    root = CallNode("all", 0)
    nodes: dict[int, CallNode] = {}

    def node_of(op_event: int) -> CallNode:
        if op_event in nodes:
            return nodes[op_event]
        op = by_event[op_event]
        parent = root
        p = op.parent
        while p is not None and by_event[p].internal:  # never nest under our own scopes
            p = by_event[p].parent
        if p is not None:
            parent = node_of(p)
        child = next((c for c in parent.children if c.name == op.name), None)
        if child is None:
            child = CallNode(op.name, parent.depth + 1)
            parent.children.append(child)
        nodes[op_event] = child
        return child

    for op in join.ops:
        if op.internal:
            continue
        node = node_of(op.event)
        node.calls += 1
        node.self_time["cpu_time"] += op.cpu_self_ns
        node.self_time["device_time"] += op.device_self_ns

    def fold(node: CallNode) -> None:
        for child in node.children:
            fold(child)
        for m in _METRICS:
            node.inclusive[m] = node.self_time[m] + sum(c.inclusive[m] for c in node.children)
        node.children.sort(key=lambda c: (-c.inclusive["device_time"], -c.inclusive["cpu_time"]))

    fold(root)
    return root


def _fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e3:.0f} µs"


def draw(
    result: ProfileResult,
    path: str | os.PathLike[str] | None = None,
    *,
    color_by: str = "auto",
    size_by: str = "auto",
    max_depth: int = 10,
    min_width: float = 0.002,
) -> Any:
    """Draw the call tree of ``result`` as an icicle; write it to ``path`` (SVG/PNG) if given.

    Parameters
    ----------
    result
        A profile (:func:`stepscope.session`, :func:`stepscope.kernel_profile`,
        :func:`stepscope.profile.load_trace`).
    path
        ``.svg`` or ``.png`` (200 dpi) output; ``None`` returns the figure only.
    color_by
        The metric whose **self** time colours each box (``auto``, ``device_time``,
        ``cpu_time``).
    size_by
        The metric whose **inclusive** time sets each box's width.
    max_depth
        Rows drawn below the root (deeper nodes are inside their ancestors' width).
    min_width
        Boxes narrower than this fraction of the root are not drawn (their time stays in the
        parent's width).

    Returns
    -------
    matplotlib.figure.Figure
        The figure (also written to ``path`` when given).
    """
    size_m = _resolve(result, size_by, "size_by")
    color_m = _resolve(result, color_by, "color_by")
    if max_depth < 1 or not 0 <= min_width < 1:
        raise Refusal(
            "profile_view_invalid",
            f"max_depth={max_depth!r} must be >= 1 and min_width={min_width!r} in [0, 1).",
            [],
        )
    tree = call_tree(result)
    require_extra("matplotlib", "report", "stepscope.draw")
    from matplotlib import colormaps  # lazy: optional extra
    from matplotlib.cm import ScalarMappable  # lazy: optional extra
    from matplotlib.colors import Normalize  # lazy: optional extra
    from matplotlib.figure import Figure  # lazy: optional extra

    total = tree.inclusive[size_m]
    boxes: list[tuple[CallNode, float, float]] = []  # node, x0, width (fractions of the root)

    def place(node: CallNode, x0: float, width: float) -> None:
        boxes.append((node, x0, width))
        if node.depth >= max_depth or not node.inclusive[size_m]:
            return
        x = x0  # children from the left; the node's self time is the uncovered rest on the right
        for child in node.children:
            w = width * child.inclusive[size_m] / node.inclusive[size_m]
            if w >= min_width:
                place(child, x, w)
            x += w

    if total:
        place(tree, 0.0, 1.0)
    depth = max((n.depth for n, _, _ in boxes), default=0) + 1
    fig = Figure(figsize=(14, 1.2 + 0.42 * depth))
    ax = fig.add_axes((0.01, 0.04, 0.86, 0.80))
    cax = fig.add_axes((0.89, 0.10, 0.015, 0.70))
    cmap = colormaps["cividis"]
    vmax = max((n.self_time[color_m] for n, _, _ in boxes), default=0) or 1
    norm = Normalize(0, vmax)
    for node, x0, w in boxes:
        value = node.self_time[color_m]
        patch = _rect((x0, -node.depth - 1), w, 0.92, cmap(norm(value)), edge="white")
        ax.add_patch(patch)
        if w < 0.03:
            continue  # too narrow to label; the width still tells its share
        room = max(4, int(w * 160))  # characters that fit at 7.5 pt in a 14-inch-wide figure
        label = node.name if len(node.name) <= room else node.name[: room - 1] + "…"
        if w >= 0.09:
            label += (
                f"\n{_fmt_ns(node.inclusive[size_m])} incl · "
                f"{_fmt_ns(node.self_time[color_m])} self"
            )
        text = ax.text(
            x0 + w / 2,
            -node.depth - 0.54,
            label,
            ha="center",
            va="center",
            fontsize=7.5,
            color="white" if norm(value) < 0.55 else "black",
        )
        text.set_clip_path(patch)  # a label never spills into its neighbour
    ax.set_xlim(0, 1)
    ax.set_ylim(-depth - 0.1, 0.05)
    ax.axis("off")
    unit, scale = ("ms", 1e6) if vmax >= 1e6 else ("µs", 1e3)
    bar = fig.colorbar(ScalarMappable(norm=Normalize(0, vmax / scale), cmap=cmap), cax=cax)
    bar.set_label(f"self {color_m.replace('_', ' ')} ({unit})", fontsize=9)
    left_out = []
    join = result._require_events()
    if join.accounting.part_b_internal_ns and size_m == "device_time":
        left_out.append(f"stepscope internal {_fmt_ns(join.accounting.part_b_internal_ns)}")
    if join.accounting.part_a_ambiguous_ns and size_m == "device_time":
        left_out.append(f"ambiguous groups {_fmt_ns(join.accounting.part_a_ambiguous_ns)}")
    fig.suptitle(
        f"call tree: width = inclusive {size_m.replace('_', ' ')} ({_fmt_ns(total)} in all), "
        f"colour = self {color_m.replace('_', ' ')}",
        fontsize=11,
        x=0.01,
        ha="left",
    )
    fig.text(
        0.01,
        0.005,
        f"device time: {result.availability.value}; source {result.source}"
        + ("; not drawn: " + ", ".join(left_out) if left_out else ""),
        fontsize=8,
    )
    if path is not None:
        out = Path(path)
        fmt = out.suffix.lower().lstrip(".")
        if fmt not in ("svg", "png"):
            raise Refusal(
                "profile_view_invalid", f"draw writes .svg or .png, not {out.name!r}.", []
            )
        import matplotlib  # lazy: optional extra

        buf = io.BytesIO()
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # SVG labels stay real text
            fig.savefig(buf, format=fmt, dpi=200)
        out.write_bytes(buf.getvalue())
    return fig


def _rect(xy: tuple[float, float], w: float, h: float, color: Any, edge: str) -> Any:
    from matplotlib.patches import Rectangle  # lazy: optional extra

    return Rectangle(xy, w, h, facecolor=color, edgecolor=edge, linewidth=0.6)

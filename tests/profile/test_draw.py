"""``ss.draw`` / ``call_tree`` on the recorded Kineto traces and on a live ResNet-18 profile.

Oracle for device time: the raw chrome-trace JSON, read here without stepscope. A device event
(kernel, memcpy, memset) belongs to the outermost host op on the thread of its runtime launch
(same ``correlation``) whose interval holds the launch; summing durations per outermost op name
must give the tree's top-level inclusive device times.
"""

from __future__ import annotations

import gzip
import json
import xml.etree.ElementTree as ET
from collections import defaultdict

import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope.errors import Refusal
from stepscope.profile import call_tree, load_trace
from tests.profile.conftest import kineto_trace

pytest.importorskip("matplotlib")

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_OP_CATS = {"cpu_op", "user_annotation"}


def _outermost_device_ns(path) -> dict[str, int]:
    """Per outermost host op name: the device time launched inside it (ns), from raw JSON."""
    events = json.load(gzip.open(path))["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    ops = defaultdict(list)
    for e in xs:
        if e.get("cat") in HOST_OP_CATS:
            ops[(e["pid"], e["tid"])].append(e)
    launches = {
        e["args"]["correlation"]: e
        for e in xs
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    out: dict[str, int] = defaultdict(int)
    for d in xs:
        if d.get("cat") not in DEVICE_CATS:
            continue
        launch = launches.get(d.get("args", {}).get("correlation"))
        if launch is None:
            continue
        holders = [
            o
            for o in ops[(launch["pid"], launch["tid"])]
            if o["ts"] <= launch["ts"] and launch["ts"] + launch["dur"] <= o["ts"] + o["dur"]
        ]
        if holders:
            outer = min(holders, key=lambda o: (o["ts"], -o["dur"]))
            out[outer["name"]] += round(d["dur"] * 1000)
    return dict(out)


def test_top_level_device_time_matches_the_raw_trace(kineto_fixtures):
    path = kineto_trace(kineto_fixtures, "cuda_alexnet_2023.json.gz")
    result = load_trace(path)
    tree = call_tree(result)
    want = _outermost_device_ns(path)
    got = {c.name: c.inclusive["device_time"] for c in tree.children if c.inclusive["device_time"]}
    assert got.keys() == want.keys()
    for name in want:  # microsecond floats in the file: allow 1 ns per event of rounding
        assert got[name] == pytest.approx(want[name], abs=200), name
    assert tree.inclusive["device_time"] == result.join.accounting.part_a_unique_ns


@pytest.mark.parametrize(
    "name",
    ["cuda_alexnet_2023", "cuda_ns_resolution_2024", "cuda_multi_stream_event_sync", "cpu_only"],
)
def test_every_node_is_its_self_time_plus_its_children(kineto_fixtures, name):
    tree = call_tree(load_trace(kineto_trace(kineto_fixtures, f"{name}.json.gz")))
    for node in tree.walk():
        for metric in ("device_time", "cpu_time"):
            assert node.inclusive[metric] == node.self_time[metric] + sum(
                c.inclusive[metric] for c in node.children
            )
        assert all(c.depth == node.depth + 1 for c in node.children)


def test_draw_writes_svg_and_png_coloured_by_device_time(kineto_fixtures, tmp_path):
    result = load_trace(kineto_trace(kineto_fixtures, "cuda_ns_resolution_2024.json.gz"))
    ss.draw(result, tmp_path / "tree.svg", color_by="device_time", size_by="device_time")
    root = ET.parse(tmp_path / "tree.svg").getroot()
    texts = [t.text or "" for t in root.iter() if t.tag.endswith("}text")]  # real <text>
    assert root.tag.endswith("svg")
    top = call_tree(result).children[0]
    assert any("inclusive device time" in t for t in texts)
    assert any(t.startswith(top.name[:10]) for t in texts)
    ss.draw(result, tmp_path / "tree.png", color_by="cpu_time", size_by="device_time")
    assert (tmp_path / "tree.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_device_time_on_a_cpu_trace_refuses_and_auto_uses_cpu_time(kineto_fixtures, tmp_path):
    result = load_trace(kineto_trace(kineto_fixtures, "cpu_only.json.gz"))
    with pytest.raises(Refusal) as err:
        ss.draw(result, color_by="device_time")
    assert err.value.code == "device_time_unavailable"
    ss.draw(result, tmp_path / "cpu.svg")  # auto: CPU time
    assert "cpu time" in (tmp_path / "cpu.svg").read_text()
    with pytest.raises(Refusal) as err:
        ss.draw(result, tmp_path / "cpu.pdf")
    assert err.value.code == "profile_view_invalid"


class Block(nn.Module):
    def __init__(self, i: int, o: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(i, o, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(o)
        self.c2 = nn.Conv2d(o, o, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(o)
        self.down = (
            nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False), nn.BatchNorm2d(o))
            if stride != 1 or i != o
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))) + self.down(x))


def resnet18(classes: int = 10) -> nn.Module:
    """ResNet-18's layout (11.2 M parameters), built from code: no download."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    i = 64
    for o, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [Block(i, o, stride), Block(o, o, 1)]
        i = o
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def test_resnet18_profile_draws_with_every_op_accounted(tmp_path):
    torch.manual_seed(0)
    model = resnet18()
    assert 11_000_000 < sum(p.numel() for p in model.parameters()) < 11_500_000
    with ss.session(device_time=False) as s:
        with ss.region("forward"):
            loss = model(torch.randn(2, 3, 32, 32)).sum()
        with ss.region("backward"):
            loss.backward()
    tree = call_tree(s.result)
    names = [c.name for c in tree.children]
    assert "stepscope.region/forward" in names and "stepscope.region/backward" in names
    cpu_self = sum(op.cpu_self_ns for op in s.result.join.ops if not op.internal)
    assert tree.inclusive["cpu_time"] == cpu_self  # nothing lost, nothing counted twice
    fig = ss.draw(s.result, tmp_path / "resnet.svg")
    assert fig.get_figwidth() == 14
    svg = (tmp_path / "resnet.svg").read_text()
    assert "stepscope.region/forward" in svg and "incl" in svg

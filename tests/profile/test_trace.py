"""load_trace on real recorded CUDA/ROCm traces, checked against independent computations."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal
from functools import cache

import pytest

from stepscope import Refusal
from stepscope.profile import Availability, load_trace
from tests.profile.conftest import kineto_trace

DEVICE_TRACES = [
    "cuda_simple_add_2023.json.gz",
    "cuda_alexnet_2023.json.gz",
    "cuda_ns_resolution_2024.json.gz",
    "cuda_multi_stream_event_sync.json.gz",
    "cuda_triton_example.json.gz",
    "rocm_mi250_minitoy.json.gz",
]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


@cache
def _raw(path):
    return json.loads(gzip.open(path).read(), parse_float=Decimal)["traceEvents"]


@cache
def _loaded(path):
    return load_trace(path)


def independent_busy_ns(events) -> int:
    """Per-device union of device intervals by a +1/-1 boundary count (not the merge sweep)."""
    bounds = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS:
            start = int(Decimal(e["ts"]) * 1000)
            end = start + int(Decimal(e["dur"]) * 1000)
            bounds[e["args"].get("device", e["pid"])] += [(start, 1), (end, -1)]
    total = 0
    for marks in bounds.values():
        depth, opened = 0, None
        for t, step in sorted(marks, key=lambda m: (m[0], -m[1])):
            if depth == 0 and step == 1:
                opened = t
            depth += step
            if depth == 0:
                total += t - opened
    return total


@pytest.mark.parametrize("name", DEVICE_TRACES)
def test_device_time_is_joined_and_busy_time_is_the_interval_union(kineto_fixtures, name):
    path = kineto_trace(kineto_fixtures, name)
    result = _loaded(path)
    raw = _raw(path)
    acc = result.join.accounting
    device = [e for e in raw if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS]
    assert acc.device_event_count == len(device) > 0
    assert acc.device_time_sum_ns == sum(int(Decimal(e["dur"]) * 1000) for e in device)
    assert acc.device_busy_ns == independent_busy_ns(raw)
    assert acc.joined_fraction >= 0.99
    assert acc.joined_ns + sum(acc.residual_ns.values()) == acc.device_time_sum_ns
    assert result.availability in (Availability.JOINED, Availability.PARTIAL)
    rows = result.hot_path(by="device_time", top=1000)
    assert sum(r.device_self_ns for r in rows) == acc.part_a_unique_ns + acc.part_a_ambiguous_ns


@pytest.mark.parametrize("name", ["cuda_simple_add_2023.json.gz", "cuda_alexnet_2023.json.gz"])
def test_2023_traces_join_through_the_launch_not_the_kernel_external_id(kineto_fixtures, name):
    result = _loaded(kineto_trace(kineto_fixtures, name))
    events = result.join.events
    kernels = [a for a in result.join.device if events[a.event].category == "kernel"]
    assert kernels
    for a in kernels:
        kernel = events[a.event]
        assert kernel.external_id == kernel.correlation  # the 2023 shape the join must survive
        assert a.launch is not None and events[a.launch].correlation == kernel.correlation
        owner = events[a.owner]
        assert owner.thread == events[a.launch].thread
        assert owner.start_ns <= events[a.launch].start_ns
        assert events[a.launch].end_ns <= owner.end_ns
        assert owner.external_id != kernel.external_id  # the id would have named no real op
    cc = result.join.cross_check
    assert cc.disagree == 0 and cc.agree == 0  # self-referencing ids are not evidence


def test_hand_checked_owners_in_the_2023_trace(kineto_fixtures):
    result = _loaded(kineto_trace(kineto_fixtures, "cuda_simple_add_2023.json.gz"))
    events = result.join.events
    owner_of = {events[a.event].correlation: events[a.owner].name for a in result.join.device}
    # Read off the raw trace by hand: kernel 218's launch sits in aten::uniform_ (inside
    # aten::rand), kernel 5110's in aten::cudnn_convolution (inside conv2d/convolution).
    assert owner_of[218] == "aten::uniform_"
    assert owner_of[5110] == "aten::cudnn_convolution"


@pytest.mark.parametrize(
    "name",
    [
        "cuda_ns_resolution_2024.json.gz",
        "rocm_mi250_minitoy.json.gz",
        "cuda_triton_example.json.gz",
    ],
)
def test_external_id_cross_check_agrees_on_newer_traces(kineto_fixtures, name):
    result = _loaded(kineto_trace(kineto_fixtures, name))
    cc = result.join.cross_check
    assert cc.disagree == 0 and cc.agree == result.join.accounting.device_event_count


def test_rocm_and_driver_launches_join(kineto_fixtures):
    rocm = _loaded(kineto_trace(kineto_fixtures, "rocm_mi250_minitoy.json.gz"))
    ev = rocm.join.events
    launches = {ev[a.launch].name for a in rocm.join.device}
    assert {"hipLaunchKernel", "hipExtModuleLaunchKernel"} <= launches
    triton = _loaded(kineto_trace(kineto_fixtures, "cuda_triton_example.json.gz"))
    (only,) = triton.join.device
    assert triton.join.events[only.launch].name == "cuLaunchKernel"
    assert triton.join.events[only.owner].name == "triton_poi_fused_add_cos_sin_0"


def test_cpu_only_trace_refuses_device_time_but_serves_cpu_time(kineto_fixtures):
    result = _loaded(kineto_trace(kineto_fixtures, "cpu_only.json.gz"))
    assert result.availability is Availability.UNAVAILABLE
    assert result.join.accounting.joined_fraction is None
    for view in (lambda: result.hot_path(by="device_time"), result.require_device_time):
        with pytest.raises(Refusal) as err:
            view()
        assert err.value.code == "device_time_unavailable" and err.value.remedies
    rows = result.hot_path(by="cpu_time", top=50)
    raw = [
        e
        for e in _raw(kineto_trace(kineto_fixtures, "cpu_only.json.gz"))
        if e.get("cat") == "cpu_op"
    ]
    assert {r.key for r in rows} >= {e["name"] for e in raw}
    assert all(r.device_self_ns is None for r in rows)  # missing, not zero
    assert "n/a" in result.table(by="cpu_time")


def test_export_round_trips_and_the_sidecar_maps_ids_exactly(kineto_fixtures, tmp_path):
    path = kineto_trace(kineto_fixtures, "rocm_mi250_minitoy.json.gz")
    result = _loaded(path)
    trace, sidecar = result.export_chrome_trace(tmp_path / "t.json")
    again = load_trace(trace)
    assert again.join.accounting == result.join.accounting
    mapping = json.loads(sidecar.read_text())
    assert mapping["schema"] == "stepscope.kineto_ids.v1"
    raw_kernels = {
        e["args"]["correlation"]: e["args"]["External id"]
        for e in _raw(path)
        if e.get("cat") in DEVICE_CATS
    }
    assert len(mapping["device_events"]) == len(raw_kernels)
    for entry in mapping["device_events"]:
        corr = entry["event"]["correlation"]
        assert entry["launch"]["correlation"] == corr
        assert entry["owner"]["external_id"] == raw_kernels[corr]  # independent: the trace's id


def test_plain_json_and_bare_event_lists_are_read(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 2.5,
            "dur": 1,
            "args": {"correlation": 9},
        },
        {
            "ph": "X",
            "cat": "kernel",
            "name": "gemm",
            "pid": 0,
            "tid": 7,
            "ts": 20,
            "dur": 3.25,
            "args": {"correlation": 9, "device": 0, "stream": 7},
        },
    ]
    (tmp_path / "list.json").write_text(json.dumps(events))
    (tmp_path / "dict.json").write_text(json.dumps({"traceEvents": events}))
    for name in ("list.json", "dict.json"):
        r = load_trace(tmp_path / name)
        assert r.availability is Availability.JOINED
        assert r.join.accounting.part_a_unique_ns == 3250
        assert r.hot_path(by="device_time")[0].key == "aten::mm"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"not json", "not valid JSON"),
        (b'{"events": []}', "no 'traceEvents'"),
        (gzip.compress(b'{"traceEvents": [')[:-6], "cannot read"),
    ],
)
def test_bad_traces_refuse_trace_invalid(tmp_path, content, why):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(Refusal) as err:
        load_trace(path)
    assert err.value.code == "trace_invalid" and why in err.value.message


def test_missing_and_oversized_traces_refuse(tmp_path):
    with pytest.raises(Refusal) as err:
        load_trace(tmp_path / "absent.json")
    assert err.value.code == "trace_invalid"
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(Refusal) as err:
        load_trace(big, max_bytes=5)
    assert err.value.code == "trace_invalid" and "bound" in err.value.message

"""kernel_profile and the result views on a real CPU profiler run."""

from __future__ import annotations

import json

import pytest
import torch

import stepscope as ss
from stepscope import Refusal
from stepscope.profile import Availability, load_trace

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only expectations")


def model_and_input():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten())
    return model, torch.randn(2, 1, 8, 8)


def test_kernel_profile_on_cpu_refuses_device_time_and_serves_cpu_time():
    model, x = model_and_input()
    r = ss.kernel_profile(model, x, warmup=1)
    assert r.availability is Availability.UNAVAILABLE
    with pytest.raises(Refusal) as err:
        r.hot_path(by="device_time")
    assert err.value.code == "device_time_unavailable"
    rows = r.hot_path(by="cpu_time", top=100)
    keys = [row.key for row in rows]
    assert "aten::conv2d" in keys and "aten::relu" in keys
    assert rows == sorted(rows, key=lambda row: -row.cpu_self_ns)
    assert abs(sum(row.share for row in r.hot_path(by="cpu_time", top=10_000)) - 1) < 1e-9
    table = r.table(by="cpu_time", top=5)
    assert "aten::" in table and "dev self us" in table and "unavailable" in table


def test_kernel_profile_takes_a_tuple_of_inputs_and_validates_warmup():
    r = ss.kernel_profile(torch.add, (torch.ones(2), torch.ones(2)))
    assert "aten::add" in {row.key for row in r.hot_path(by="cpu_time")}
    with pytest.raises(Refusal) as err:
        ss.kernel_profile(torch.add, (torch.ones(2), torch.ones(2)), warmup=-1)
    assert err.value.code == "profile_view_invalid"


@pytest.mark.parametrize(("by", "top"), [("gpu", 3), ("cpu_time", 0), ("cpu_time", 1.5)])
def test_bad_view_arguments_refuse(by, top):
    r = ss.kernel_profile(torch.nn.ReLU(), torch.randn(3))
    with pytest.raises(Refusal) as err:
        r.hot_path(by=by, top=top)
    assert err.value.code == "profile_view_invalid"


def test_export_writes_a_loadable_trace_and_an_id_sidecar(tmp_path):
    model, x = model_and_input()
    with ss.session() as s:
        with ss.region("forward"):
            model(x)
    trace, sidecar = s.result.export_chrome_trace(tmp_path / "run.json")
    reloaded = load_trace(trace)
    live = {row.key: row.calls for row in s.result.hot_path(by="cpu_time", top=1000)}
    saved = {row.key: row.calls for row in reloaded.hot_path(by="cpu_time", top=1000)}
    assert saved == live
    mapping = json.loads(sidecar.read_text())
    assert mapping["availability"] == "unavailable" and mapping["device_events"] == []


def test_regions_record_occurrences_parents_and_metadata_in_a_session():
    with ss.session() as s:
        with ss.region("epoch", index=0):
            for i in range(2):
                with ss.region("batch", i=i, lr=0.1):
                    torch.ones(2).sum()
    regions = [sp for sp in s.result.spans if sp.altitude.value == "user_region"]
    epoch, b0, b1 = regions
    assert (b0.occurrence, b1.occurrence) == (0, 1)
    assert b0.parent_id == b1.parent_id == epoch.span_id
    assert b1.metadata == {"i": 1, "lr": 0.1}
    ops = {op.name: op for op in s.result.join.ops}
    batch_ops = [op for op in s.result.join.ops if op.name == "stepscope.region/batch"]
    assert len(batch_ops) == 2
    assert all(op.parent == ops["stepscope.region/epoch"].event for op in batch_ops)


def test_stepscope_internal_work_is_left_out_of_the_per_op_views():
    from stepscope.profile import compat

    with ss.session() as s:
        torch.ones(3).sum()
        with compat.record_function("stepscope.internal/reduce"):
            torch.ones(3).prod()  # our own work, e.g. a collector reduction
    keys = {row.key for row in s.result.hot_path(by="cpu_time", top=1000)}
    assert "aten::sum" in keys
    assert "aten::prod" not in keys and "stepscope.internal/reduce" not in keys
    internal = {op.name for op in s.result.join.ops if op.internal}
    assert {"aten::prod", "stepscope.internal/reduce"} <= internal

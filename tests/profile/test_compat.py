"""The in-memory extraction path: _KinetoEvent shapes (real on CPU, CUDA-shaped stand-ins)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stepscope import Refusal
from stepscope.profile import compat, from_profiler, join_events
from stepscope.profile.results import Availability, availability_of
from stepscope.profile.trace import TraceEventKind

PID, MAIN_TID, BWD_TID = 4242, 4242, 4300


class FakeKinetoEvent:
    """Answers the _KinetoEvent methods compat reads, with the documented CUDA semantics:
    correlation_id() is the External id on ops and CUPTI's id on runtime/device events;
    linked_correlation_id() names the op's External id on runtime/device events."""

    def __init__(self, name, activity, start, dur, index, resource, corr, linked=0, cuda=False):
        self._v = SimpleNamespace(
            name=name, activity=activity, start=start, dur=dur, index=index,
            resource=resource, corr=corr, linked=linked, cuda=cuda,
        )  # fmt: skip

    def name(self):
        return self._v.name

    def activity_type(self):
        return self._v.activity

    def start_ns(self):
        return self._v.start

    def duration_ns(self):
        return self._v.dur

    def device_index(self):
        return self._v.index

    def device_resource_id(self):
        return self._v.resource

    def device_type(self):
        return "DeviceType.CUDA" if self._v.cuda else "DeviceType.CPU"

    def correlation_id(self):
        return self._v.corr

    def external_id(self):
        return self._v.corr

    def linked_correlation_id(self):
        return self._v.linked


def fake_prof(events):
    results = SimpleNamespace(events=lambda: events)
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=results))


def cuda_shaped_events():
    E = FakeKinetoEvent
    return [
        E("aten::linear", "cpu_op", 1_000, 900, PID, MAIN_TID, corr=11),
        E("aten::addmm", "cpu_op", 1_100, 600, PID, MAIN_TID, corr=12),
        E("cudaLaunchKernel", "cuda_runtime", 1_200, 50, PID, MAIN_TID, corr=900, linked=12),
        # backward on the autograd device thread: ids collide with the forward op (pytorch/pytorch#124388)
        E("autograd::engine::evaluate_function: AddmmBackward0", "cpu_op", 5_000, 800, PID,
          BWD_TID, corr=900),
        E("aten::mm", "cpu_op", 5_100, 500, PID, BWD_TID, corr=31),
        E("cudaLaunchKernel", "cuda_runtime", 5_150, 40, PID, BWD_TID, corr=901, linked=31),
        E("cudaMemcpyAsync", "cuda_runtime", 5_300, 40, PID, BWD_TID, corr=902, linked=31),
        E("sm90_gemm", "kernel", 1_400, 300, 0, 7, corr=900, linked=12, cuda=True),
        E("sm90_gemm_bwd", "kernel", 5_400, 200, 0, 7, corr=901, linked=31, cuda=True),
        E("Memcpy DtoD", "gpu_memcpy", 5_500, 100, 0, 13, corr=902, linked=31, cuda=True),
        E("Memset (Device)", "", 5_700, 10, 0, 13, corr=0, cuda=True),  # kind from the name
    ]  # fmt: skip


def test_cuda_shaped_in_memory_events_join_by_correlation_and_thread():
    loaded = compat.extract_events(fake_prof(cuda_shaped_events()), device_requested=True)
    assert loaded.source == "in_memory_kineto" and loaded.disclosures == ()
    kinds = [e.kind for e in loaded.events]
    assert kinds.count(TraceEventKind.KERNEL) == 2 and kinds.count(TraceEventKind.RUNTIME) == 3
    assert kinds[-2:] == [TraceEventKind.MEMCPY, TraceEventKind.MEMSET]
    result = join_events(loaded.events)
    ev = result.events
    owner = {ev[a.event].name: (ev[a.owner].name if a.owner is not None else a.status.value)
             for a in result.device}  # fmt: skip
    assert owner == {
        "sm90_gemm": "aten::addmm",
        "sm90_gemm_bwd": "aten::mm",  # not the backward node whose External id is 900
        "Memcpy DtoD": "aten::mm",
        "Memset (Device)": "no_correlation_id",
    }
    acc = result.accounting
    assert acc.part_a_unique_ns == 600 and acc.residual_ns == {"no_correlation_id": 10}
    assert availability_of(result, loaded.device_capable) is Availability.PARTIAL
    assert (result.cross_check.agree, result.cross_check.disagree) == (3, 0)


def test_missing_in_memory_surface_falls_back_with_a_disclosure():
    exported = []

    class OldProfiler:
        profiler = SimpleNamespace()  # no kineto_results on this "torch"

        def export_chrome_trace(self, path):
            exported.append(path)
            with open(path, "w") as handle:
                handle.write('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm",'
                             ' "pid": 1, "tid": 1, "ts": 1.5, "dur": 2}]}')  # fmt: skip

    loaded = compat.extract_events(OldProfiler(), device_requested=False)
    assert loaded.source == "chrome_trace_fallback" and len(exported) == 1
    assert "kineto_results" in loaded.disclosures[-1]
    assert [(e.name, e.start_ns, e.dur_ns) for e in loaded.events] == [("aten::mm", 1500, 2000)]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_in_memory_thread_ids_are_the_system_thread_ids_of_the_trace():
    """A forked TorchScript task runs on another thread. The in-memory path must key host events
    by the same system thread id that Kineto's chrome export writes as ``tid``."""

    @torch.jit.script
    def child(x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, x).sum()

    @torch.jit.script
    def parent(x: torch.Tensor) -> torch.Tensor:
        return torch.jit.wait(torch.jit.fork(child, x))

    x = torch.randn(64, 64)
    parent(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        parent(x)
    memory, trace = from_profiler(prof), from_profiler(prof, force_fallback=True)
    tids = []
    for result in (memory, trace):
        ops = {op.name: op for op in result.join.ops}
        if "<forked function>" not in ops:
            pytest.skip("this torch ran the fork inline")
        forked, caller = ops["<forked function>"], ops["parent"]
        assert forked.thread != caller.thread
        assert ops["aten::mm"].parent == forked.event and forked.parent is None
        tids.append((caller.thread[1], forked.thread[1]))
    assert tids[0] == tids[1]


def test_reading_a_running_profiler_refuses():
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    try:
        torch.ones(2).sum()
        with pytest.raises(Refusal) as err:
            from_profiler(prof)
        assert err.value.code == "profiler_session_inactive" and "still running" in str(err.value)
    finally:
        prof.stop()
    assert from_profiler(prof).hot_path(by="cpu_time")

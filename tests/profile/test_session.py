"""The one session door on a real CPU profiler: modes, nesting, exit paths, altitudes, views."""

from __future__ import annotations

import collections

import pytest
import torch

import stepscope as ss
from stepscope import Refusal
from stepscope.profile import Altitude, Availability, active_session, from_profiler
from stepscope.profile.session import BOUNDARY_DISCLOSURE


def profiler_on() -> bool:
    return torch.autograd._profiler_enabled()


def assert_restored(s=None):
    assert active_session() is None
    assert not profiler_on()
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0
    if s is not None and s.capture is not None:
        assert s.capture.handle_count == 0
        assert s.registry.open_count == 0


def tiny_step(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
    x = torch.randn(4, 6)
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_owned_session_joins_cpu_events_and_refuses_device_time_on_a_cpu_build():
    with ss.session() as s:
        assert active_session() is s and profiler_on()
        with ss.region("step"):
            tiny_step()
    assert_restored(s)
    r = s.result
    assert r.source == "in_memory_kineto"
    assert r.availability is (
        Availability.UNAVAILABLE if not torch.cuda.is_available() else r.availability
    )
    keys = {row.key for row in r.hot_path(by="cpu_time", top=500)}
    assert {"aten::addmm", "aten::relu", "stepscope.region/step"} <= keys
    if not torch.cuda.is_available():
        with pytest.raises(Refusal) as err:
            r.hot_path(by="device_time")
        assert err.value.code == "device_time_unavailable"


def test_cpu_view_counts_match_torch_key_averages():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with ss.session(profiler=prof):
            tiny_step()
    ours = {row.key: row for row in from_profiler(prof).hot_path(by="cpu_time", top=10_000)}
    theirs = {avg.key: avg for avg in prof.key_averages()}
    for key in ("aten::addmm", "aten::relu", "aten::mean", "aten::mm", "aten::pow"):
        # torch reports us; both are sums of the same events' durations
        assert abs(ours[key].cpu_total_ns / 1000 - theirs[key].cpu_time_total) <= 0.002
        assert abs(ours[key].cpu_self_ns / 1000 - theirs[key].self_cpu_time_total) <= 0.002
    for key in ("aten::addmm", "aten::relu", "aten::mm", "aten::pow"):  # no same-name nests
        assert ours[key].calls == theirs[key].count
    # torch merges the lone same-name child of aten::mean into it; we count both events
    assert ours["aten::mean"].calls == 2 * theirs["aten::mean"].count


def test_borrowed_session_marks_but_never_steps_or_stops_the_callers_profiler(monkeypatch):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        steps = []
        monkeypatch.setattr(prof, "step", lambda: steps.append(1))
        monkeypatch.setattr(prof, "stop", lambda: steps.append("stop"))
        with ss.session(profiler=prof) as s:
            with ss.region("inner"):
                torch.ones(3).sum()
        assert profiler_on() and active_session() is None and steps == []
        monkeypatch.undo()
    assert not profiler_on()
    assert s.result.availability is Availability.NOT_REQUESTED
    with pytest.raises(Refusal) as err:
        s.result.hot_path(by="cpu_time")
    assert err.value.code == "profiler_session_inactive"
    names = {op.name for op in from_profiler(prof).join.ops}
    assert "stepscope.region/inner" in names
    assert any(n.startswith("stepscope.session/") for n in names)


def test_borrowed_profiler_must_be_a_started_torch_profiler():
    for bad in (object(), torch.profiler.profile()):
        with pytest.raises(Refusal) as err:
            with ss.session(profiler=bad):
                pass
        assert err.value.code == "profiler_session_inactive"
    assert_restored()


def test_nested_session_refuses_and_the_outer_one_survives():
    with ss.session() as outer:
        with pytest.raises(Refusal) as err:
            with ss.session():
                pass
        assert err.value.code == "profiler_session_nested"
        assert active_session() is outer and profiler_on()
        torch.ones(2).sum()
    assert_restored(outer)
    assert outer.result is not None


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_exception_paths_restore_markers_hooks_and_the_slot(exc_type):
    s = ss.session(altitudes=("op", "aten", "grad_fn_fire"))
    with pytest.raises(exc_type):
        with s:
            leaked = ss.region("leaked")
            leaked.__enter__()  # never exited: the boundary must close it
            tiny_step()
            raise exc_type("boom")
    assert_restored(s)
    with pytest.raises(Refusal) as err:  # no result after an exception, and never a None
        _ = s.result
    assert err.value.code == "profiler_session_inactive"
    (span,) = [sp for sp in s.registry.spans if sp.name == "leaked"]
    assert span.closed_by == BOUNDARY_DISCLOSURE
    with ss.session() as again:  # the slot is free again
        pass
    assert again.result is not None


def test_early_return_restores_everything():
    def run():
        with ss.session(altitudes=("op", "grad_fn_fire")) as s:
            tiny_step()
            return s
        raise AssertionError("unreachable")

    s = run()
    assert_restored(s)
    assert s.result is not None


def test_leaked_span_on_success_is_disclosed_in_the_result():
    with ss.session() as s:
        ss.region("left_open").__enter__()
    assert any(BOUNDARY_DISCLOSURE in d for d in s.result.disclosures)


def test_altitude_spans_are_recorded_and_observation_is_pure():
    control_loss, control_grads = tiny_step(seed=3)
    with ss.session(altitudes=("op", "aten", "grad_fn_fire")) as s:
        loss, grads = tiny_step(seed=3)
    assert_restored(s)
    assert torch.equal(loss, control_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, control_grads))
    by_alt = collections.defaultdict(set)
    for span in s.result.spans:
        by_alt[span.altitude].add(span.name)
        assert span.end_ns is not None and span.end_ns >= span.start_ns
    assert {"torch.randn", "Tensor.pow"} <= by_alt[Altitude.OP]
    assert "aten::addmm" in by_alt[Altitude.ATEN]
    assert {"AddmmBackward0", "ReluBackward0", "MeanBackward0"} <= by_alt[Altitude.GRAD_FN_FIRE]
    # our dispatch-mode brackets are our overhead, not the user's ops
    keys = {row.key for row in s.result.hot_path(by="cpu_time", top=1000)}
    assert "PythonDispatchMode" not in keys


def test_unknown_altitude_refuses():
    with pytest.raises(Refusal) as err:
        ss.session(altitudes=("kernel",))
    assert err.value.code == "profile_view_invalid"


def test_device_time_false_is_not_requested():
    with ss.session(device_time=False) as s:
        torch.ones(2).sum()
    assert s.result.availability is Availability.NOT_REQUESTED
    with pytest.raises(Refusal) as err:
        s.result.hot_path(by="device_time")
    assert err.value.code == "device_time_unavailable"
    assert s.result.hot_path(by="cpu_time")


def test_fallback_path_is_disclosed_and_matches_the_in_memory_events():
    with ss.session() as a:
        tiny_step()
    with ss.session(force_fallback=True) as b:
        tiny_step()
    assert b.result.source == "chrome_trace_fallback"
    assert any("temporary chrome trace" in d for d in b.result.disclosures)

    def names(result):
        return collections.Counter(
            op.name for op in result.join.ops if not op.name.startswith("stepscope.session/")
        )

    assert names(a.result) == names(b.result)


def test_node_hooks_are_really_gone_after_the_session():
    lin = torch.nn.Linear(3, 3)
    with ss.session(altitudes=("grad_fn_fire",)) as s:
        out = lin(torch.randn(2, 3)).sum()  # graph built while hooks are installed
    before = len(s.registry.spans)
    out.backward()  # the nodes fire after the session: no hook may run
    assert len(s.registry.spans) == before
    assert lin.weight.grad is not None


def test_owned_session_inside_a_running_raw_profiler_refuses_and_points_to_borrowed_mode():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with pytest.raises(Refusal) as err:
            with ss.session():
                pass
        assert err.value.code == "profiler_session_nested"
        assert any("profiler=prof" in r for r in err.value.remedies)
        assert active_session() is None and profiler_on()
    assert_restored()


@pytest.mark.parametrize("wait", [0, 1, 2])
def test_borrowed_scheduled_profiler_is_accepted_in_any_phase(wait):
    # the most common torch.profiler use: a schedule; the session opens during its wait phase
    traces = []
    sched = torch.profiler.schedule(wait=wait, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=sched,
        on_trace_ready=lambda p: traces.append({e.name for e in p.events()}),
    ) as prof:
        with ss.session(profiler=prof):
            for step in range(wait + 3 + 1):
                with ss.region(f"step{step}"):
                    torch.ones(4).sum()
                prof.step()
        assert active_session() is None
    assert_restored()
    (names,) = traces  # one active window: steps wait+1 and wait+2 (after one warm-up step)
    regions = {n for n in names if n.startswith("stepscope.region/")}
    assert regions == {f"stepscope.region/step{wait + 1}", f"stepscope.region/step{wait + 2}"}


def test_a_stopped_scheduled_profiler_is_still_refused():
    prof = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=1),
    )
    with pytest.raises(Refusal) as err:  # never started
        with ss.session(profiler=prof):
            pass
    assert err.value.code == "profiler_session_inactive"
    with prof:
        prof.step()
    with pytest.raises(Refusal) as err:  # started and stopped
        with ss.session(profiler=prof):
            pass
    assert err.value.code == "profiler_session_inactive"
    assert_restored()

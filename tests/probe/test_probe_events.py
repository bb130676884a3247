"""Probe rows reach live subscribers (trackers) as events, not only ``stepscope export``."""

from __future__ import annotations

import pytest
import torch

from stepscope import HistoryCollector, WatchSettings
from stepscope.events import EventBus
from stepscope.events.trackers.jsonl import JsonlTracker, read_jsonl
from stepscope.probe import DenseProbe, probe_scalar_rows, write_probe_record
from tests.probe.probe_testkit import make_data, make_model


def test_probe_rows_are_published_to_the_collectors_trackers(tmp_path):
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=12)
    bus = EventBus()
    tracker = bus.subscribe(JsonlTracker(tmp_path / "events.jsonl"))
    settings = WatchSettings(output_dir=str(tmp_path / "run"), event_bus=bus)
    with HistoryCollector(model, sites="*", streams=("activation",), settings=settings) as col:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with col.step(opt, examples=len(y)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        active = {"3": False}  # a masked layer: its moments are unavailable, never 0
        rec = probe.measure(model, step=1, examples_seen=len(y), epoch=0, active=active)
        write_probe_record(col, rec)
    tracker.close()
    events = [e for e in read_jsonl(tmp_path / "events.jsonl") if e.name.startswith("probe/")]
    scalars = {e.name: e for e in events if e.kind.value == "scalar"}
    expected = probe_scalar_rows(rec)  # the rows the artifact holds
    assert set(scalars) == set(expected)
    for name, value in expected.items():
        assert scalars[name].value == pytest.approx(value)
        assert scalars[name].source.value == "probe"
        assert (scalars[name].optimizer_step, scalars[name].examples_seen) == (1, len(y))
    missing = {e.name for e in events if e.kind.value == "unavailable"}
    assert "probe/3/fisher_trace" in missing and "probe/3/fisher_trace" not in scalars


def test_a_ram_only_collector_keeps_the_probe_rows():
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=12)
    with HistoryCollector(model, sites="*", streams=("activation",)) as col:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with col.step(opt, examples=len(y)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        rec = probe.measure(model, step=1, examples_seen=len(y), epoch=0)
        write_probe_record(col, rec)
        with col.step(opt, examples=len(y)):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        view = col.run_view()
        loss = view.scalar("probe/model/loss")
    assert loss.steps.tolist() == [1] and loss.values[0] == pytest.approx(rec.model.loss)

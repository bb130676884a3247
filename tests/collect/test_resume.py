"""Resume: refuse a changed model or grid, continue step and examples_seen, record own facts."""

from __future__ import annotations

import pytest
import torch

import stepscope as ss
from stepscope.history import model_fingerprint
from tests.collect.models import ResNetish


def _ce(out, y):
    return torch.nn.functional.cross_entropy(out, y)


def _train(model, path, steps, *, resume=False, start=0, cadence=1, **settings):
    torch.manual_seed(start)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    s = ss.WatchSettings(
        output_dir=str(path), durable=False, commit_steps=1, resume=resume, **settings
    )
    g = torch.Generator().manual_seed(100 + start)
    with ss.HistoryCollector(model, cadence=cadence, settings=s) as c:
        first = c._next_step
        for _ in range(steps):
            x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)
            with c.step(opt, examples=len(y), epoch=0):
                opt.zero_grad()
                _ce(model(x), y).backward()
                opt.step()
    return first


def test_resume_with_a_changed_architecture_is_refused_naming_both_fingerprints(tmp_path):
    _train(ResNetish(), tmp_path / "r", 3)
    other = ResNetish(classes=7)
    with pytest.raises(ss.Refusal) as err:
        _train(other, tmp_path / "r", 1, resume=True)
    assert err.value.code == "resume_fingerprint_mismatch"
    assert model_fingerprint(ResNetish()) in err.value.message
    assert model_fingerprint(other) in err.value.message
    h = ss.open_run(tmp_path / "r")  # the artifact is untouched and unlocked
    assert len(h.segments) == 1 and h.steps.tolist() == [0, 1, 2]
    _train(ResNetish(), tmp_path / "r", 1, resume=True)  # the right model still resumes


def test_resume_with_another_histogram_window_of_the_same_width_is_refused(tmp_path):
    base = ss.stats.HistogramDescriptor()
    shifted = ss.stats.HistogramDescriptor(lo_exp=-40, hi_exp=24)
    assert shifted.width == base.width  # same width: only the window moved
    _train(ResNetish(), tmp_path / "r", 2)
    with pytest.raises(ss.Refusal) as err:
        _train(ResNetish(), tmp_path / "r", 1, resume=True, histogram_descriptor=shifted)
    assert err.value.code == "resume_descriptor_mismatch"
    assert "'lo_exp': -48" in err.value.message and "'lo_exp': -40" in err.value.message


def test_resume_continues_steps_and_examples_and_records_its_own_facts(tmp_path):
    torch.manual_seed(0)
    model = ResNetish()
    _train(model, tmp_path / "r", 5, cadence=1, extra={"phase": "first"})
    first = _train(model, tmp_path / "r", 3, resume=True, cadence=2, extra={"phase": "second"})
    assert first == 5
    h = ss.open_run(tmp_path / "r")
    blocks = h.step_blocks()
    assert [b.optimizer_step for b in blocks] == list(range(8))
    assert [b.examples_seen for b in blocks] == [4 * (i + 1) for i in range(8)]
    parent, child = h.segments
    assert (child.parent_segment, child.resumed_at_step) == (parent.segment_id, 5)
    assert child.run_id == parent.run_id
    assert child.model_fingerprint == model_fingerprint(model)
    assert parent.extra["phase"] == "first" and child.extra["phase"] == "second"
    assert parent.cadences["gradient"] == 1 and child.cadences["gradient"] == 2


def test_resume_at_a_declared_checkpoint_step_supersedes_the_later_steps(tmp_path):
    model = ResNetish()
    _train(model, tmp_path / "r", 8)
    first = _train(model, tmp_path / "r", 2, resume=True, resume_step=4)
    assert first == 4
    h = ss.open_run(tmp_path / "r")
    blocks = h.step_blocks()
    assert [b.optimizer_step for b in blocks] == [0, 1, 2, 3, 4, 5]
    assert [b.examples_seen for b in blocks] == [4, 8, 12, 16, 20, 24]
    assert h.segments[-1].resumed_at_step == 4


def test_resume_beyond_the_committed_steps_keeps_examples_unknown_unless_declared(tmp_path):
    model = ResNetish()
    _train(model, tmp_path / "r", 3)
    _train(model, tmp_path / "r", 1, resume=True, resume_step=10)
    assert ss.open_run(tmp_path / "r").step_blocks()[-1].examples_seen is None
    _train(model, tmp_path / "r", 1, resume=True, resume_step=20, resume_examples_seen=80)
    assert ss.open_run(tmp_path / "r").step_blocks()[-1].examples_seen == 84


def test_resume_requires_the_explicit_spelling(tmp_path):
    model = ResNetish()
    _train(model, tmp_path / "r", 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = ss.WatchSettings(output_dir=str(tmp_path / "r"), resume=True, durable=False)
    with pytest.raises(ss.Refusal) as err:
        ss.HistoryCollector(model, settings=s, optimizer=opt)
    assert err.value.code == "step_transaction_required"


def test_a_bare_step_in_a_resumed_collector_is_not_recorded_as_implicit(tmp_path):
    model = ResNetish()
    _train(model, tmp_path / "r", 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = ss.WatchSettings(output_dir=str(tmp_path / "r"), resume=True, durable=False)
    with ss.HistoryCollector(model, settings=s) as c:
        c._attach_optimizer(opt)  # as a framework callback would have, in an earlier step
        _ce(model(torch.randn(4, 3, 8, 8)), torch.tensor([0, 1, 2, 3])).backward()
        with pytest.warns(RuntimeWarning):
            opt.step()
    blocks = ss.open_run(tmp_path / "r").step_blocks()
    assert [b.provenance.value for b in blocks] == ["explicit", "explicit"]


def test_resume_settings_are_validated():
    with pytest.raises(ss.Refusal) as err:
        ss.WatchSettings(output_dir="x", resume_step=3)
    assert err.value.code == "settings_invalid"
    with pytest.raises(ss.Refusal):
        ss.WatchSettings(output_dir="x", resume=True, resume_step=-1)


def test_an_evaluation_right_after_resume_is_at_the_resumed_coordinate(tmp_path):
    model = ResNetish()
    _train(model, tmp_path / "r", 3)
    s = ss.WatchSettings(output_dir=str(tmp_path / "r"), resume=True, durable=False)
    with ss.HistoryCollector(model, settings=s) as c:
        rec = c.log_eval("val", {"loss": 1.0})
    assert (rec.optimizer_step, rec.examples_seen) == (3, 12)

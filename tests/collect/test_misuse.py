"""Misuse is never silent: five common mistakes, each warned or refused.

Each test makes the mistake as a newcomer would, on a real collector, and checks the warning
(category, that it comes once, and that it points at the test's own line) or the refusal, and
what was recorded against what the optimizer actually did.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import stepscope as ss


def _model_opt():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _misuse(seen: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in seen if issubclass(w.category, ss.MisuseWarning)]


def test_training_without_the_step_block_warns_at_close_on_the_users_line():
    model, opt = _model_opt()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        line = inspect.currentframe().f_lineno + 1
        with ss.HistoryCollector(model, sites="*") as c:  # the line the warning names
            for _ in range(5):
                opt.zero_grad()
                model(torch.randn(4, 4)).sum().backward()
                opt.step()  # forgot `with c.step(opt):`
    got = _misuse(seen)
    assert len(got) == 1, [str(w.message) for w in seen]
    assert "0 steps recorded" in str(got[0].message)
    assert "with collector.step(optimizer" in str(got[0].message)
    assert got[0].filename == __file__ and got[0].lineno == line
    assert len(ss.open_run(c.run_dir).steps) == 0  # what it says is what was recorded


def test_a_collector_that_saw_no_training_does_not_warn():
    model, _ = _model_opt()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with ss.HistoryCollector(model, sites="*", settings=ss.WatchSettings(in_memory=True)):
            with torch.no_grad():
                model.eval()(torch.randn(2, 4))  # evaluation only
    assert _misuse(seen) == []


def test_st_log_after_its_step_closed_warns_once_and_keeps_the_value_at_its_step():
    model, opt = _model_opt()
    logged = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with ss.HistoryCollector(model, sites="*") as c:
            for _ in range(3):
                with c.step(opt, examples=4) as st:
                    opt.zero_grad()
                    loss = model(torch.randn(4, 4)).pow(2).mean()
                    loss.backward()
                    opt.step()
                st.log("loss", loss)  # one indentation level too far out
                logged.append(float(loss))
    got = _misuse(seen)
    assert len(got) == 1 and "after its step (0) closed" in str(got[0].message)
    assert got[0].filename == __file__
    loss = ss.open_run(c.run_dir).scalars("loss")
    assert loss.steps.tolist() == [0, 1, 2]  # each at its own step, none on the next one
    assert loss.values.tolist() == pytest.approx(logged, rel=1e-6)


def test_a_step_without_an_optimizer_warns_that_updates_go_unrecorded():
    model, opt = _model_opt()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with ss.HistoryCollector(model, sites="*", cadence=1) as c:
            for _ in range(2):
                with c.step(examples=4):  # forgot to pass opt
                    opt.zero_grad()
                    model(torch.randn(4, 4)).sum().backward()
                    opt.step()
    got = _misuse(seen)
    assert len(got) == 1 and "no optimizer" in str(got[0].message)
    assert "with collector.step(optimizer)" in str(got[0].message)
    assert got[0].filename == __file__
    upd = ss.open_run(c.run_dir).series("0.weight", "update", "total")
    assert upd.valid_count == 0  # indeed nothing: the warning told the truth


def test_a_step_with_another_models_optimizer_is_refused_with_the_remedy():
    model, _ = _model_opt()
    other = torch.nn.Linear(3, 3)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    with ss.HistoryCollector(model, sites="*") as c:
        with pytest.raises(ss.Refusal) as err:
            with c.step(other_opt, examples=4):
                pass
    assert err.value.code == "optimizer_foreign"
    assert "model.parameters()" in err.value.remedies[0]


def test_the_models_own_optimizer_inside_a_list_is_accepted():
    model, opt = _model_opt()
    with ss.HistoryCollector(model, sites="*", cadence=1) as c:
        with c.step([opt], examples=4):
            model(torch.randn(4, 4)).sum().backward()
            opt.step()
    assert ss.open_run(c.run_dir).step_blocks()[0].truth.applied.value == "yes"


def test_series_refuses_an_int_and_names_the_string_spelling():
    model, opt = _model_opt()
    with ss.HistoryCollector(model, sites="*", cadence=1) as c:
        with c.step(opt, examples=4):
            model(torch.randn(4, 4)).sum().backward()
            opt.step()
    run = ss.open_run(c.run_dir)
    with pytest.raises(ss.Refusal) as err:
        run.series(1, "activation", "zero")  # meant the ReLU, named "1"
    assert err.value.code == "history_site_name_required"
    assert "series('1', ...)" in err.value.remedies[0] and "ReLU" in err.value.message
    relu = run.series("1", "activation", "total")
    assert relu.values.tolist() == [32.0]  # the ReLU's 4 x 8 outputs
    record = next(s for s in run.sites if s.name == "1")
    assert run.series(record, "activation", "total").values.tolist() == [32.0]

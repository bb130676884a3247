"""Model surgery: a replaced module or parameter is detected at the next
step, its series ends with a reason, and the replacement is observed as a new series."""

import torch

from stepscope import open_run
from stepscope.collect import Cadence, HistoryCollector, WatchSettings
from stepscope.collect.surgery import find_changes
from tests.collect.models import Numbers


def train_step(c, model, opt, x):
    with c.step(opt):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def collector(model, path):
    return HistoryCollector(
        model,
        streams=("activation", "gradient", "parameter"),
        cadence=Cadence(1, 1),
        settings=WatchSettings(output_dir=str(path)),
    )


def test_a_replaced_module_ends_its_series_and_the_new_one_is_observed(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = collector(model, tmp_path / "m")
    train_step(c, model, opt, torch.randn(5, 3))
    train_step(c, model, opt, torch.randn(5, 3))
    model[2] = torch.nn.Linear(4, 2)  # surgery between steps 1 and 2
    opt.add_param_group({"params": list(model[2].parameters())})
    seen = []
    model[2].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    train_step(c, model, opt, torch.randn(5, 3))
    c.close()
    h = open_run(tmp_path / "m")
    ended = {(s.name, s.ended_step, s.ended_reason) for s in h.sites if s.ended_step is not None}
    assert ended == {
        ("2", 2, "module_replaced"),
        ("2.weight", 2, "module_replaced"),
        ("2.bias", 2, "module_replaced"),
    }
    new = [s for s in h.sites if s.name == "2.weight" and s.ended_step is None]
    assert len(new) == 1 and new[0].started_step == 2
    # the new module's weight, as the optimizer left it, is what step 2 recorded
    got = h.series(new[0], "parameter", "sum_squares").values
    assert list(h.series(new[0], "parameter", "sum_squares").steps) == [2]
    assert got[0] == float((model[2].weight.detach().double() ** 2).sum())
    want = Numbers.of(seen)
    act = next(s for s in h.sites if s.name == "2" and s.ended_step is None)
    assert list(h.series(act, "activation", "total").steps) == [2]
    assert h.series(act, "activation", "total").values[0] == want.numel
    assert h.series(act, "activation", "max").values[0] == want.max


def test_surgery_on_a_quiet_step_ends_the_series_at_the_next_step_that_records(tmp_path):
    """Nothing is recorded on a step with no stream due, so a module replaced then is found
    before the next due step: its series ends there and the replacement is observed there."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(
        model,
        streams=("activation", "parameter"),
        cadence=Cadence(3, None),
        settings=WatchSettings(output_dir=str(tmp_path / "q")),
    )
    seen = []
    for step in range(4):
        if step == 1:  # a quiet step (steps 0 and 3 are due)
            model[2] = torch.nn.Linear(4, 2)
            opt.add_param_group({"params": list(model[2].parameters())})
            model[2].register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
        train_step(c, model, opt, torch.randn(5, 3))
    c.close()
    h = open_run(tmp_path / "q")
    ended = {(s.name, s.ended_step, s.ended_reason) for s in h.sites if s.ended_step is not None}
    assert ended == {("2", 3, "module_replaced"), ("2.weight", 3, "module_replaced"),
                     ("2.bias", 3, "module_replaced")}  # fmt: skip
    new = next(s for s in h.sites if s.name == "2.weight" and s.ended_step is None)
    assert new.started_step == 3
    assert h.series(new, "parameter", "sum_squares").values.tolist() == [
        float((model[2].weight.detach().double() ** 2).sum())
    ]
    act = next(s for s in h.sites if s.name == "2" and s.ended_step is None)
    assert h.series(act, "activation", "max").values.tolist() == [Numbers.of(seen[-1:]).max]


def test_a_replaced_parameter_ends_its_series_at_the_next_step(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = collector(model, tmp_path / "p")
    train_step(c, model, opt, torch.randn(4, 3))
    model[0].weight = torch.nn.Parameter(torch.zeros(2, 3))
    train_step(c, model, opt, torch.randn(4, 3))  # the new weight is in no optimizer
    c.close()
    h = open_run(tmp_path / "p")
    weight = [s for s in h.sites if s.name == "0.weight"]
    assert [(s.started_step, s.ended_step, s.ended_reason) for s in weight] == [
        (0, 1, "parameter_replaced"),
        (1, None, None),
    ]
    # the old parameter is no longer reported as observed after the surgery
    assert list(h.series(weight[0], "parameter", "total").steps) == [0]
    assert list(h.series(weight[1], "parameter", "max").values) == [0.0]


def test_a_removed_module_ends_its_series_and_is_not_recorded_again():
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Linear(2, 2))
    model.add_module("b", torch.nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, streams=("activation", "gradient"), cadence=1)
    train_step(c, model, opt, torch.randn(3, 2))
    del model.b
    train_step(c, model, opt, torch.randn(3, 2))
    c.close()
    ended = {s.name: s.ended_reason for s in c.sites if s.ended_step == 1}
    assert ended == {
        "b": "module_removed",
        "b.weight": "module_removed",
        "b.bias": "module_removed",
    }
    names = {c.sites[int(i)].name for b in c.last_batches for i in b.site_ids}
    assert names == {"a", "a.weight", "a.bias"}


def test_find_changes_sees_nothing_on_an_unchanged_model():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    c = HistoryCollector(model, streams=("gradient",), cadence=1)
    assert find_changes(model, c._sites.bound, c.rows) == []
    c.close()


def _nested():
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    return torch.nn.Sequential(inner, torch.nn.Sequential(torch.nn.Linear(3, 2)))


def _edges_hold(edges):
    return all(holder.get(key) is obj for holder, key, obj in edges)


def test_identity_edges_hold_exactly_until_find_changes_would_find_something():
    """Brute force over surgeries: whenever the precomputed links still hold, the full walk
    from the root finds no change; a real change always breaks a link."""
    from stepscope.collect.sites import build_rows, leaf_modules
    from stepscope.collect.surgery import identity_edges
    from stepscope.selection import select_modules

    def rows_of(model):
        selected = select_modules(model, leaf_modules)
        rows = build_rows(selected, ("parameter",), None)
        return dict(selected), [r for r in rows if r.param is not None]

    surgeries = {
        "none": lambda m: None,
        "leaf replaced": lambda m: m[0].__setitem__(0, torch.nn.Linear(3, 3)),
        "container replaced, same children": lambda m: m.__setitem__(
            1, torch.nn.Sequential(m[1][0])
        ),
        "container replaced, new child": lambda m: m.__setitem__(
            1, torch.nn.Sequential(torch.nn.Linear(3, 2))
        ),
        "leaf removed": lambda m: delattr(m[0], "1"),
        "parameter replaced": lambda m: setattr(
            m[0][0], "weight", torch.nn.Parameter(torch.zeros(3, 3))
        ),
        "parameter removed": lambda m: setattr(m[1][0], "bias", None),
    }
    for name, surgery in surgeries.items():
        model = _nested()
        modules, params = rows_of(model)
        edges = identity_edges(model, modules, params)
        surgery(model)
        changes = find_changes(model, modules, params)
        if _edges_hold(edges):
            assert changes == [], name
        else:
            assert changes or name == "container replaced, same children", name
        expect_change = name not in ("none", "container replaced, same children")
        assert bool(changes) == expect_change, name

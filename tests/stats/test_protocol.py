"""Dataset-mode aggregation: correct numbers, hooks removed on every path, state untouched."""

import pytest
import torch

from stepscope import Refusal
from stepscope._purity import snapshot_rng
from stepscope.stats import Histogram, HistogramDescriptor, RunningStats, StreamingStat, aggregate


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(6, 3)
    )


def hook_count(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def test_statistics_equal_a_manual_pass_over_the_outputs():
    model = make_model()
    batches = [torch.randn(4, 5) for _ in range(3)]
    got = aggregate(model, batches, sites=["ReLU", "3"], stats=("spine", "histogram"))
    assert set(got) == {"1", "3"}
    model.eval()
    with torch.no_grad():
        relu_out = torch.cat([model[1](model[0](b)) for b in batches])
        last_out = torch.cat([model(b) for b in batches])
    for name, ref in (("1", relu_out), ("3", last_out)):
        spine, hist = RunningStats(), Histogram()
        spine.update(ref)
        hist.update(ref)
        assert got[name]["histogram"] == hist
        assert got[name]["spine"].total == spine.total and got[name]["spine"].zero == spine.zero
        assert got[name]["spine"].sum == pytest.approx(spine.sum)


def test_modes_rng_and_parameters_are_untouched():
    model = make_model().train()
    params = [p.detach().clone() for p in model.parameters()]
    batches = [torch.randn(4, 5)]
    rng = snapshot_rng()
    aggregate(model, batches, sites="*", stats="spine")
    assert all(m.training for m in model.modules())
    assert rng.equals(snapshot_rng())
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters()))
    assert hook_count(model) == 0


def test_train_mode_run_restores_rng_too():
    model = make_model().train()
    batches = [torch.randn(4, 5)]
    rng = snapshot_rng()
    aggregate(model, batches, sites="Dropout", stats="spine", eval_mode=False)
    assert rng.equals(snapshot_rng())  # dropout drew numbers; the state is put back


def test_empty_selection_refuses_before_running():
    model = make_model()
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))

    def batches():
        calls.append("iterated")
        yield torch.randn(2, 5)

    with pytest.raises(Refusal) as err:
        aggregate(model, batches(), sites="Conv2d", stats="spine")
    assert err.value.code == "selection_empty"
    assert calls == []


def test_unknown_statistic_refuses():
    with pytest.raises(Refusal) as err:
        aggregate(make_model(), [], sites="Linear", stats="kurtosis")
    assert err.value.code == "stat_unknown"


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_hooks_removed_when_the_batch_iterable_raises(exc):
    model = make_model().train()

    def batches():
        yield torch.randn(2, 5)
        raise exc

    with pytest.raises(type(exc)):
        aggregate(model, batches(), sites="*", stats="spine")
    assert hook_count(model) == 0
    assert model.training


def test_custom_factories_descriptor_and_tuple_outputs():
    class Split(torch.nn.Module):
        def forward(self, x):
            return x[:, :2], x[:, 2:]

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Split())
    desc = HistogramDescriptor(bins_per_octave=2)
    got = aggregate(
        model,
        [torch.randn(3, 4)],
        sites="Split",
        stats={"h": "histogram", "s": RunningStats},
        descriptor=desc,
    )
    assert set(got) == {"1#0", "1#1"}
    assert got["1#0"]["s"].total == 6
    assert isinstance(got["1#1"]["h"], StreamingStat)

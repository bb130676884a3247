"""Every selected site gets a record, and telemetry never raises into the training step.

Regression tests, including the CUDA-graph capture probe: tensors are
found inside structured outputs by the documented rule (or a named key), outputs without a
tensor and unreducible tensors (complex, tensor subclasses, stream capture) record
``unsupported`` with a reason, a reduction that raises records ``capture_failed``.
"""

from dataclasses import dataclass

import pytest
import torch

from stepscope.collect import HistoryCollector, WatchSettings
from stepscope.collect import staging as capture_mod
from stepscope.collect import staging as staging_mod
from stepscope.collect.staging import find_path, find_tensor, reducible
from stepscope.history import Presence
from stepscope.history.batch import member_of
from tests.collect.models import Numbers, close, spine_numbers


def records(c, stream="activation"):
    """``{site: (presence, numbers or None, row disclosures)}`` of the last step."""
    out = {}
    for b in c.last_batches:
        if b.stream.value != stream:
            continue
        for j, sid in enumerate(b.site_ids):
            p = member_of(Presence, b.presence[j])
            nums = spine_numbers(b.spines[j]) if p is Presence.OBSERVED else None
            out[c.sites[int(sid)].name] = (
                p,
                nums,
                b.row_disclosures[j] if b.row_disclosures else (),
            )
    return out


@dataclass
class Out:
    loss: torch.Tensor | None
    logits: torch.Tensor
    extra: dict


class Structured(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4)
        self.kind = kind

    def forward(self, x):
        h = self.lin(x)
        if self.kind == "dataclass":
            return Out(None, h, {"hidden": h * 2})
        if self.kind == "dict":
            return {"aux": None, "pair": (h + 1, h)}
        if self.kind == "none":
            return None
        return [h.sum(-1).tolist()]  # no tensor at all


class Outer(torch.nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.inner = Structured(kind)

    def forward(self, x):
        self.inner(x)
        return self.inner.lin(x)


@pytest.mark.parametrize(
    ("kind", "key", "expect"),
    [
        ("dataclass", None, lambda h: h),  # loss is None: skipped; logits is first
        ("dataclass", "extra.hidden", lambda h: h * 2),
        ("dict", None, lambda h: h + 1),
        ("dict", "pair.1", lambda h: h),
    ],
)
def test_tensors_inside_structured_outputs_follow_the_rule_or_the_named_key(kind, key, expect):
    torch.manual_seed(0)
    model = Outer(kind)
    keys = {} if key is None else {"inner": key}
    c = HistoryCollector(
        model,
        sites="inner",
        streams=("activation",),
        cadence=1,
        settings=WatchSettings(output_keys=keys),
    )
    x = torch.randn(5, 3)
    with c.step():
        model(x)
    c.close()
    with torch.no_grad():
        want = Numbers.of([expect(model.inner.lin(x))])
    presence, got, _ = records(c)["inner"]
    assert presence is Presence.OBSERVED and close(got, want)


@pytest.mark.parametrize("kind", ["none", "list"])
def test_an_output_without_a_tensor_is_unsupported_with_a_reason(kind):
    model = Outer(kind)
    c = HistoryCollector(model, sites="inner", streams=("activation",), cadence=1)
    for _ in range(2):
        with c.step():
            model(torch.randn(2, 3))
    c.close()
    assert records(c)["inner"] == (Presence.UNSUPPORTED, None, ("unsupported:no_tensor_output",))


def test_a_named_key_that_is_missing_is_unsupported():
    model = Outer("dict")
    c = HistoryCollector(
        model,
        sites="inner",
        streams=("activation",),
        cadence=1,
        settings=WatchSettings(output_keys={"inner": "logits"}),
    )
    with c.step():
        model(torch.randn(2, 3))
    c.close()
    p, _, notes = records(c)["inner"]
    assert p is Presence.UNSUPPORTED and notes == ("unsupported:output_key_missing:logits",)


def test_output_rule_reads_mappings_dataclasses_and_sequences_in_order():
    a, b = torch.zeros(1), torch.ones(1)
    assert find_tensor((None, {"x": None, "y": [b, a]})) is b
    assert find_tensor(Out(None, a, {})) is a
    assert find_tensor([[[[[a]]]]]) is None  # deeper than MAX_DEPTH
    assert find_path({"h": (a, b)}, "h.-1") is b
    assert find_path({"h": (a, b)}, "h.2") is None


class Doubled(torch.Tensor):
    """A tensor subclass (stands in for DTensor / FakeTensor)."""


def test_tensor_subclasses_and_complex_tensors_are_never_handed_to_the_kernel():
    sub = torch.randn(3).as_subclass(Doubled)
    assert reducible(sub) == (None, "tensor_subclass:Doubled")
    assert reducible(torch.randn(2, dtype=torch.complex64)) == (None, "complex:complex64")
    sparse = torch.sparse_coo_tensor([[0, 2, 0]], [1.0, 2.0, 3.0], (4,))
    values, note = reducible(sparse)
    assert note == "sparse_values" and values.tolist() == [4.0, 2.0]  # coalesced


def test_a_tensor_subclass_activation_is_recorded_unsupported_and_training_goes_on():
    class Sub(torch.nn.Module):
        def forward(self, x):
            return x.as_subclass(Doubled)

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Sub())
    c = HistoryCollector(model, streams=("activation",), cadence=1)
    with c.step():
        model(torch.randn(3, 2))
    c.close()
    assert records(c)["1"] == (Presence.UNSUPPORTED, None, ("unsupported:tensor_subclass:Doubled",))


def test_a_reduction_that_raises_records_capture_failed_not_an_exception(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    real = staging_mod.Staging.write

    def flaky(self, row, tensor, histogram):
        if row == c._sites.rows[id(model[1])]["activation"].index:  # the Tanh's row only
            raise RuntimeError("kernel fault")
        return real(self, row, tensor, histogram)

    monkeypatch.setattr(staging_mod.Staging, "write", flaky)
    c = HistoryCollector(model, streams=("activation", "gradient"), cadence=1)
    with c.step(opt):
        model(torch.randn(3, 2)).sum().backward()
        opt.step()
    c.close()
    rec = records(c)
    assert rec["1"] == (Presence.CAPTURE_FAILED, None, ("capture_failed:RuntimeError",))
    assert rec["0"][0] is Presence.OBSERVED
    assert all(p is Presence.OBSERVED for p, _, _ in records(c, "gradient").values())


def test_hooks_during_cuda_graph_capture_record_unsupported(monkeypatch):
    # the capture probe substituted on the CPU: every hook that fires "during capture"
    monkeypatch.setattr(capture_mod, "cuda_graph_capturing", lambda: True)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, streams=("activation", "gradient", "parameter"), cadence=1)
    before = [p.detach().clone() for p in model.parameters()]
    with c.step(opt):
        model(torch.randn(3, 2)).sum().backward()
        opt.step()
    c.close()
    for stream in ("activation", "gradient", "parameter"):
        for p, nums, notes in records(c, stream).values():
            assert (p, nums, notes) == (
                Presence.UNSUPPORTED,
                None,
                ("unsupported:cuda_graph_capture",),
            )
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_dtype_the_kernels_refuse_is_recorded_unsupported():
    class ToUInt32(torch.nn.Module):
        def forward(self, x):
            return (x > 0).to(torch.uint32)

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), ToUInt32())
    c = HistoryCollector(model, streams=("activation",), cadence=1)
    with c.step():
        model(torch.randn(3, 2))
    c.close()
    assert records(c)["1"] == (Presence.UNSUPPORTED, None, ("unsupported:dtype:uint32",))


def test_a_forward_hook_that_raises_records_capture_failed_and_the_step_completes(monkeypatch):
    from stepscope.collect import activations

    def broken(output, key):
        raise KeyError("no")

    monkeypatch.setattr(activations, "module_output", broken)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, streams=("activation", "gradient"), cadence=1)
    for _ in range(2):
        with c.step(opt):
            model(torch.randn(3, 2)).sum().backward()
            opt.step()
    c.close()
    assert records(c)["0"] == (Presence.CAPTURE_FAILED, None, ("capture_failed:KeyError",))
    assert all(p is Presence.OBSERVED for p, _, _ in records(c, "gradient").values())


def test_output_keys_must_map_globs_to_paths():
    from stepscope import Refusal

    with pytest.raises(Refusal) as err:
        WatchSettings(output_keys={"encoder": 0})
    assert err.value.code == "settings_invalid"

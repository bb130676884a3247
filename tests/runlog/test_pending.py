"""The step buffer: exact values, one host transfer, exact branch counts, refusals."""

import numpy as np
import pytest
import torch

import stepscope.transfer as transfer_mod
from stepscope import Refusal
from stepscope.runlog import BranchField, PendingStep, branch_scalar


def test_tensor_scalars_reach_the_host_in_one_transfer_without_item(monkeypatch):
    values = [0.1 * i + 1e-9 for i in range(50)]
    p = PendingStep()
    for i, v in enumerate(values):
        p.add_scalar(f"s{i}", torch.tensor(v, dtype=torch.float64))
    p.add_scalar("lr", 0.05)
    calls, items = [], []
    real = transfer_mod.to_host
    monkeypatch.setattr(transfer_mod, "to_host", lambda t: calls.append(t.shape) or real(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: items.append(1) or 0.0)
    d = p.drain(step=3)
    monkeypatch.undo()
    assert len(calls) == 1 and items == []
    assert [d.scalars[f"s{i}"] for i in range(50)] == values  # float64 tensors: bit-exact
    assert d.scalars["lr"] == 0.05
    assert p.drain(step=4).scalars == {}  # drained means cleared


def test_last_write_wins_and_explicit_steps_are_kept_apart():
    p = PendingStep()
    p.add_scalar("loss", 2.0)
    p.add_scalar("loss", 1.5)
    p.add_scalar("loss", 9.0, step=1)
    p.add_scalar("lr", 0.1, step=5)  # the step being drained: a current-step row
    d = p.drain(step=5)
    assert d.scalars == {"loss": 1.5, "lr": 0.1}
    assert d.dated == (("loss", 1, 9.0),)


def test_nan_is_a_value_but_none_and_vectors_refuse():
    p = PendingStep()
    p.add_scalar("loss", float("nan"))
    assert np.isnan(p.drain(0).scalars["loss"])
    for bad in (None, "1.0", torch.ones(3), torch.tensor(1j)):
        with pytest.raises(Refusal) as err:
            p.add_scalar("x", bad)
        assert err.value.code == "runlog_value_invalid"


@pytest.mark.parametrize("name", ["", "clock/training_seconds", "clock/elapsed_seconds", 3])
def test_reserved_or_empty_names_refuse(name):
    with pytest.raises(Refusal) as err:
        PendingStep().add_scalar(name, 1.0)
    assert err.value.code == "runlog_name_invalid"


def test_user_branch_quantities_beside_mask_rows_are_allowed():
    p = PendingStep()
    p.add_scalar("branch/blocks.1/survival_probability", 0.8)
    p.add_mask("blocks.1", torch.tensor([1, 0, 1, 1, 0]))
    d = p.drain(0)
    assert d.scalars["branch/blocks.1/survival_probability"] == 0.8
    assert d.scalars[branch_scalar("blocks.1", BranchField.ACTIVE_FRACTION)] == 3 / 5


def test_a_mask_field_logged_by_hand_too_refuses_when_logged_in_either_order():
    p = PendingStep()
    p.add_scalar(branch_scalar("b", BranchField.ACTIVE_FRACTION), 0.5)
    with pytest.raises(Refusal) as err:
        p.add_mask("b", [True])
    assert err.value.code == "runlog_name_invalid"
    q = PendingStep()
    q.add_mask("c", [True])
    with pytest.raises(Refusal) as err:
        q.add_scalar(branch_scalar("c", BranchField.TOTAL_UNITS), 1.0)
    assert err.value.code == "runlog_name_invalid"
    q.add_scalar(branch_scalar("c", BranchField.TOTAL_UNITS), 1.0, step=7)  # another step: fine
    assert q.drain(0).dated == ((branch_scalar("c", BranchField.TOTAL_UNITS), 7, 1.0),)


def test_mask_counts_are_exact_and_accumulate_over_micro_batches():
    g = torch.Generator().manual_seed(3)
    parts = [torch.rand(37, generator=g) < 0.7 for _ in range(3)]
    p = PendingStep()
    for m in parts:
        p.add_mask("blocks.4", m, nominal_macs_per_unit=1234.0)
    (a,) = p.drain(step=9).activity
    active = sum(int(m.sum()) for m in parts)  # independent count
    assert (a.step, a.active_units, a.total_units) == (9, active, 111)
    assert a.active_fraction == active / 111
    assert a.nominal_skipped_macs == (111 - active) * 1234.0
    assert a.ran


def test_scaled_survival_masks_count_nonzero_entries_and_no_macs_means_none():
    # stochastic depth often multiplies by mask / p: any nonzero entry is an active unit
    p = PendingStep()
    p.add_mask("blocks.0", torch.tensor([0.0, 1.25, 1.25, 0.0]))
    d = p.drain(0)
    (a,) = d.activity
    assert (a.active_units, a.total_units, a.nominal_skipped_macs) == (2, 4, None)
    assert branch_scalar("blocks.0", BranchField.NOMINAL_SKIPPED_MACS) not in d.scalars


def test_branch_dim_gives_one_branch_per_expert():
    routes = torch.tensor([[1, 0, 0], [1, 0, 0], [0, 0, 1], [1, 0, 1]], dtype=torch.bool)
    p = PendingStep()
    p.add_mask("moe.experts", routes, branch_dim=1, nominal_macs_per_unit=10.0)
    got = {a.name: (a.active_units, a.total_units) for a in p.drain(0).activity}
    assert got == {"moe.experts.0": (3, 4), "moe.experts.1": (0, 4), "moe.experts.2": (2, 4)}


@pytest.mark.parametrize(
    "mask,kwargs",
    [
        (torch.zeros(0, dtype=torch.bool), {}),
        (torch.tensor([1j]), {}),
        (torch.ones(3), {"nominal_macs_per_unit": -1.0}),
        (torch.ones(3), {"nominal_macs_per_unit": float("inf")}),
    ],
)
def test_bad_masks_refuse(mask, kwargs):
    with pytest.raises(Refusal) as err:
        PendingStep().add_mask("b", mask, **kwargs)
    assert err.value.code == "runlog_mask_invalid"


def test_one_element_tensors_of_any_shape_and_dtype_read_back_exactly():
    values = {
        "f32_0d": torch.tensor(0.1, dtype=torch.float32),
        "f32_11": torch.tensor([[0.1]], dtype=torch.float32),
        "bf16": torch.tensor(0.1, dtype=torch.bfloat16),
        "f16_1": torch.tensor([0.1], dtype=torch.float16),
        "i64": torch.tensor(2**40 + 1),
        "flag": torch.tensor(True),
        "grad": torch.tensor(0.3, requires_grad=True) * 2,
    }
    expect = {k: float(v.detach().double().reshape(())) for k, v in values.items()}
    for single in ("bf16", "f32_11", "grad"):  # the one-tensor path
        p = PendingStep()
        p.add_scalar(single, values[single])
        assert p.drain(0).scalars == {single: expect[single]}
    p = PendingStep()
    for k, v in values.items():
        p.add_scalar(k, v)
    assert p.drain(0).scalars == expect  # the stacked path

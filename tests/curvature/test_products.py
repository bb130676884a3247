"""Curvature-vector products and directional quotients against dense float64 oracles.

Oracles are built independently of the operators: the Hessian with ``torch.func.hessian`` of the
mean loss over a flat parameter vector, the GGN from the full logit Jacobian (``jacrev``) and the
softmax Hessian, the empirical Fisher from the full per-example-loss Jacobian.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from stepscope._purity import snapshot_rng
from stepscope.curvature.eigen import top_eigenvalues
from stepscope.curvature.estimators import trace
from stepscope.curvature.products import make_operator, probe_operator
from stepscope.curvature.quadratic import directional
from stepscope.errors import Refusal
from tests.curvature.curvature_testkit import dense_oracle

KINDS = ["hessian", "ggn", "empirical_fisher"]


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def _bn_dropout(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Dropout(0.3), nn.Linear(6, 3)
    )
    model.train()
    model(torch.randn(16, 4))  # non-trivial running statistics
    return model


def _conv(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Softplus(), nn.Flatten(), nn.Linear(2 * 2 * 2, 3))


class _UnusedHead(nn.Module):
    """A model with a parameter that the loss never sees (zero rows/columns in every matrix)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.Linear(5, 3))
        self.unused_head = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _unused(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return _UnusedHead()


CASES = {
    "mlp_tanh": dict(build=_mlp, x_shape=(7, 4), seed=0),
    "mlp_batchnorm_dropout": dict(build=_bn_dropout, x_shape=(6, 4), seed=1),
    "conv_softplus": dict(build=_conv, x_shape=(5, 1, 4, 4), seed=2),
    "unused_parameter": dict(build=_unused, x_shape=(6, 4), seed=3),
}


def _case(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    case = CASES[name]
    model = case["build"](case["seed"])
    gen = torch.Generator().manual_seed(case["seed"] + 100)
    x = torch.randn(*case["x_shape"], generator=gen)
    y = torch.randint(0, 3, (case["x_shape"][0],), generator=gen)
    return model, x, y


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1).double() for t in tensors])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", KINDS)
def test_operator_columns_equal_dense_float64_oracle(case: str, kind: str) -> None:
    model, x, y = _case(case)
    oracle = dense_oracle(model, x, y, kind)
    with probe_operator(model, x, y, kind, dtype=torch.float64) as op:
        eye = torch.eye(op.dim, dtype=torch.float64)
        dense = torch.stack([op.matvec_flat(e) for e in eye], dim=1)
        assert op.products_used == op.dim
    torch.testing.assert_close(dense, oracle, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("direction", ["mean_gradient", "random", "given", "last_update"])
def test_directional_quotient_matches_oracle_to_1e10(case: str, kind: str, direction: str) -> None:
    model, x, y = _case(case)
    oracle = dense_oracle(model, x, y, kind)
    shapes = [p.shape for p in model.parameters()]
    gen = torch.Generator().manual_seed(7)
    given = [torch.randn(s, generator=gen) for s in shapes]
    kwargs: dict = {"kind": kind, "dtype": torch.float64}
    if direction == "given":
        result = directional(model, x, y, given, **kwargs)
        v = _flat(given)
    elif direction == "last_update":
        result = directional(model, x, y, "last_update", update=given, **kwargs)
        v = _flat(given)
    elif direction == "random":
        result = directional(model, x, y, "random", seed=3, **kwargs)
        again = directional(model, x, y, "random", seed=3, **kwargs)
        other = directional(model, x, y, "random", seed=4, **kwargs)
        assert again.value == result.value and other.value != result.value
        v = None
    else:
        result = directional(model, x, y, "mean_gradient", **kwargs)
        v = _mean_gradient_oracle(model, x, y)
    assert result.direction == ("given" if direction == "given" else direction)
    assert result.products_used == 1
    if v is None:  # random: the quotient must lie in the oracle's numerical range
        eig = torch.linalg.eigvalsh(oracle)
        assert float(eig[0]) - 1e-12 <= result.value <= float(eig[-1]) + 1e-12
        return
    expected = float(v @ oracle @ v / (v @ v))
    assert result.value == pytest.approx(expected, rel=1e-10, abs=1e-14)
    assert result.direction_norm == pytest.approx(float(v.norm()), rel=1e-12)


def _mean_gradient_oracle(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    clone = __import__("copy").deepcopy(model).double().eval()
    loss = F.cross_entropy(clone(x.double()), y)
    grads = torch.autograd.grad(
        loss, list(clone.parameters()), allow_unused=True, materialize_grads=True
    )
    return _flat(grads)


def _saddle_model() -> nn.Module:
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.05)  # near the saddle at W1 = W2 = 0 of a deep linear network
    return model


def test_saddle_direction_is_negative_for_hessian_and_nonnegative_for_ggn() -> None:
    model = _saddle_model()
    x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 3
    h = dense_oracle(model, x, y, "hessian")
    eigval, eigvec = torch.linalg.eigh(h)
    assert eigval[0] < -1e-3  # the oracle confirms a negative-curvature direction exists
    direction = [c.float() for c in _split(eigvec[:, 0], model)]
    signed = directional(model, x, y, direction, kind="hessian", dtype=torch.float64)
    ggn = directional(model, x, y, direction, kind="ggn", dtype=torch.float64)
    ef = directional(model, x, y, direction, kind="empirical_fisher", dtype=torch.float64)
    v = _flat(direction)
    assert signed.value == pytest.approx(float(v @ h @ v / (v @ v)), rel=1e-10)
    assert signed.value < 0 and signed.signed
    assert ggn.value >= 0 and not ggn.signed and ef.value >= 0
    names = {signed.quantity, ggn.quantity, ef.quantity}
    assert names == {
        "hessian_rayleigh_quotient_signed",
        "ggn_rayleigh_quotient",
        "empirical_fisher_rayleigh_quotient",
    }


def _split(flat: torch.Tensor, model: nn.Module) -> list[torch.Tensor]:
    sizes = [p.numel() for p in model.parameters()]
    return [c.reshape(p.shape) for c, p in zip(torch.split(flat, sizes), model.parameters())]


def test_result_is_json_ready_and_labelled() -> None:
    model, x, y = _case("mlp_tanh")
    result = directional(model, x, y, "random", kind="ggn", seed=11)
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["quantity"] == "ggn_rayleigh_quotient"
    assert payload["seed"] == 11 and payload["estimated"] is False
    assert payload["dtype"] == "float32" and "mean cross-entropy" in payload["loss_convention"]
    assert payload["seconds"] > 0 and payload["num_parameters"] == 43


def test_zero_direction_gives_none_not_zero() -> None:
    model, x, y = _case("mlp_tanh")
    zeros = [torch.zeros_like(p) for p in model.parameters()]
    result = directional(model, x, y, zeros, kind="hessian")
    assert result.value is None and result.products_used == 0 and result.direction_norm == 0.0


class _Tuple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).unsqueeze(1)


class _Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).detach()


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda m, x, y: directional(m, x, y, "last_update"), "curvature_input_invalid"),
        (lambda m, x, y: directional(m, x, y, kind="fisher"), "curvature_mode_invalid"),
        (lambda m, x, y: directional(m, x, y, "sideways"), "curvature_mode_invalid"),
        (lambda m, x, y: directional(m, x, y, loss="mse"), "curvature_mode_invalid"),
        (lambda m, x, y: directional(m, x, y, [torch.ones(2)]), "curvature_input_invalid"),
        (lambda m, x, y: directional(m, x, y.float()), "curvature_input_invalid"),
        (lambda m, x, y: directional(m, x, y[:-1]), "curvature_input_invalid"),
        (lambda m, x, y: directional(m, x, y + 3), "curvature_input_invalid"),
        (lambda m, x, y: directional(m, x * math.inf, y), "curvature_input_invalid"),
        (lambda m, x, y: directional(m, x, y, dtype=torch.float16), "curvature_input_invalid"),
        (lambda m, x, y: directional(_Tuple(), x, y), "curvature_model_unsupported"),
        (lambda m, x, y: directional(_Detached(), x, y), "curvature_model_unsupported"),
        (
            lambda m, x, y: directional(m.requires_grad_(False), x, y),
            "curvature_model_unsupported",
        ),
        (
            lambda m, x, y: directional(
                m, x, y, [torch.full_like(p, math.nan) for p in m.parameters()]
            ),
            "curvature_input_invalid",
        ),
    ],
)
def test_bad_input_refuses_with_code_and_remedy(call, code: str) -> None:
    model, x, y = _case("mlp_tanh")
    with pytest.raises(Refusal) as err:
        call(model, x, y)
    assert err.value.code == code


def test_last_update_refusal_names_the_remedy() -> None:
    model, x, y = _case("mlp_tanh")
    with pytest.raises(Refusal) as err:
        directional(model, x, y, "last_update")
    assert any("update=" in r for r in err.value.remedies)


def _state(model: nn.Module) -> dict:
    return {
        "modes": [m.training for m in model.modules()],
        "params": [p.detach().clone() for p in model.parameters()],
        "grad_ids": [id(p.grad) for p in model.parameters()],
        "grads": [p.grad.clone() for p in model.parameters()],
        "flags": [p.requires_grad for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers()],
    }


CALLS = {
    "directional_hessian": lambda m, x, y, d: directional(m, x, y, "random", dtype=d),
    "directional_ggn_mean_gradient": lambda m, x, y, d: directional(m, x, y, kind="ggn", dtype=d),
    "top_eigenvalues_ef_power": lambda m, x, y, d: top_eigenvalues(
        m, x, y, kind="empirical_fisher", method="power", max_iter=5, dtype=d
    ),
    "top_eigenvalues_hessian_lanczos": lambda m, x, y, d: top_eigenvalues(
        m, x, y, k=2, max_iter=10, dtype=d
    ),
    "trace_ggn_hutchpp": lambda m, x, y, d: trace(
        m, x, y, kind="ggn", method="hutch++", samples=6, dtype=d
    ),
}


@pytest.mark.parametrize("dtype", [None, torch.float64])
@pytest.mark.parametrize("name", list(CALLS))
def test_modes_params_grads_buffers_and_rng_are_bitwise_preserved(name: str, dtype) -> None:
    model, x, y = _case("mlp_batchnorm_dropout")
    model.train()
    model[1].eval()  # mixed modes must come back exactly
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before, rng = _state(model), snapshot_rng()
    CALLS[name](model, x, y, dtype)
    after = _state(model)
    assert snapshot_rng().equals(rng)
    assert after["modes"] == before["modes"] and after["flags"] == before["flags"]
    assert after["grad_ids"] == before["grad_ids"]
    for key in ("params", "grads", "buffers"):
        assert all(torch.equal(a, b) for a, b in zip(after[key], before[key])), key


def test_state_is_restored_when_the_measurement_refuses() -> None:
    model, x, y = _case("mlp_batchnorm_dropout")
    model.train()
    rng = snapshot_rng()
    with pytest.raises(Refusal):
        directional(model, x, y + 3)
    assert model.training and all(m.training for m in model.modules())
    assert snapshot_rng().equals(rng)


def test_products_and_gradients_are_counted() -> None:
    model, x, y = _case("mlp_tanh")
    op = make_operator(model, x, y, "ggn")
    assert (op.products_used, op.gradients_used) == (0, 0)
    op.mean_gradient()
    for _ in range(3):
        op.matvec([torch.ones_like(p) for p in model.parameters()])
    assert (op.products_used, op.gradients_used) == (3, 1) and op.seconds > 0
    with pytest.raises(Refusal):
        op.matvec([torch.ones(1)])


class _ReverseOnlySquare(torch.autograd.Function):
    """An op with a backward but no forward-mode rule (jvp)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _ReverseOnlyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ReverseOnlySquare.apply(self.lin(x))


def test_layer_without_forward_mode_refuses_ggn_but_hessian_still_works() -> None:
    torch.manual_seed(0)
    model = _ReverseOnlyModel()
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    with pytest.raises(Refusal) as err:
        directional(model, x, y, "random", kind="ggn")
    assert err.value.code == "curvature_model_unsupported"
    assert any("hessian" in r for r in err.value.remedies)
    assert directional(model, x, y, "random", kind="hessian").value is not None


def test_the_hessian_doc_examples_run_as_written(capsys) -> None:
    """docs/hessian.md (the module examples run in tests/test_doctests.py)."""
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "hessian.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, str(doc), "exec"), {"__name__": "__doc_example__"})
    assert "hessian_rayleigh_quotient_signed" in capsys.readouterr().out


@pytest.mark.parametrize("kind", KINDS)
def test_float32_model_is_measured_in_float32_and_float64_on_request(kind: str) -> None:
    model, x, y = _case("mlp_tanh")
    oracle = dense_oracle(model, x, y, kind)
    gen = torch.Generator().manual_seed(2)
    direction = [torch.randn(p.shape, generator=gen) for p in model.parameters()]
    v = _flat(direction)
    expected = float(v @ oracle @ v / (v @ v))
    single = directional(model, x, y, direction, kind=kind)
    double = directional(model, x, y, direction, kind=kind, dtype=torch.float64)
    assert (single.dtype, double.dtype) == ("float32", "float64")
    assert single.value == pytest.approx(expected, rel=1e-4)
    assert double.value == pytest.approx(expected, rel=1e-10)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the copy was a copy


@pytest.mark.parametrize("kind", KINDS)
def test_conventions_agree_with_curvlinops_mean_reduction(kind: str) -> None:
    curvlinops = pytest.importorskip("curvlinops", reason="curvlinops-for-pytorch not installed")
    operator = {
        "hessian": curvlinops.HessianLinearOperator,
        "ggn": curvlinops.GGNLinearOperator,
        "empirical_fisher": curvlinops.EFLinearOperator,
    }[kind]
    model, x, y = _case("mlp_tanh")
    model = model.double()
    x = x.double()
    theirs = operator(model, nn.CrossEntropyLoss(), list(model.parameters()), [(x, y)])
    with probe_operator(model, x, y, kind) as op:
        eye = torch.eye(op.dim, dtype=torch.float64)
        ours = torch.stack([op.matvec_flat(e) for e in eye], dim=1)
    torch.testing.assert_close(ours, theirs @ eye, rtol=1e-10, atol=1e-13)

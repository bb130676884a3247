"""Top eigenvalues of the Hessian, GGN or empirical Fisher, with residuals and honest convergence.

For a symmetric :math:`M` and a unit vector :math:`v` with Rayleigh quotient
:math:`\\theta = v^\\top M v`, some eigenvalue :math:`\\lambda` of :math:`M` satisfies

.. math::

    |\\lambda - \\theta| \\le \\|M v - \\theta v\\|_2 = r,

and :math:`|\\lambda - \\theta| \\le r^2 / \\mathrm{gap}` once the gap to the rest of the spectrum
is larger than :math:`r`. Each reported value therefore comes with its **explicitly computed**
residual :math:`r` (one more product per value, counted), and is called converged only if

.. math::

    r \\le \\mathrm{tol} \\cdot \\max_j |\\theta_j|,

the right-hand side being the largest Ritz value magnitude seen, an estimate of
:math:`\\|M\\|_2`. A residual certifies that the value is close to *an* eigenvalue; like any
Krylov method it cannot prove that no larger eigenvalue was missed (negligible for random starts).

* ``method="lanczos"``: Lanczos with full reorthogonalisation from a seeded Gaussian start,
  restarted orthogonally on an invariant subspace (so repeated eigenvalues are found); returns the
  ``k`` **algebraically largest** eigenvalues (``which="largest_algebraic"``).
* ``method="power"``: power iteration with deflation by orthogonalisation (as in PyHessian);
  returns eigenvalues of **largest magnitude** (``which="largest_magnitude"``), one at a time.

For the Hessian the values are signed; GGN and empirical-Fisher eigenvalues are non-negative.

Example
-------
>>> import torch
>>> from stepscope.curvature.eigen import top_eigenvalues
>>> _ = torch.manual_seed(0)
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
>>> x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
>>> r = top_eigenvalues(model, x, y, k=2, kind="ggn", dtype=torch.float64, tol=1e-8)
>>> r.quantity, len(r.values), all(r.converged)
('ggn_top_eigenvalues', 2, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from stepscope.codec import parse_enum
from stepscope.curvature.base import (
    LOSS_CONVENTION,
    CostLedger,
    CurvatureKind,
    CurvatureOperator,
    LossKind,
)
from stepscope.curvature.products import probe_operator
from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal
from stepscope.probe.outputs import OutputSelector

CRITERION = "converged iff ||M v - theta v||_2 <= tol * max_j |theta_j| (explicit residual)"


class EigenMethod(str, Enum):
    """Iterative eigensolvers."""

    LANCZOS = "lanczos"
    POWER = "power"


WHICH = {EigenMethod.LANCZOS: "largest_algebraic", EigenMethod.POWER: "largest_magnitude"}


@dataclass(frozen=True)
class TopEigenvalues(CostLedger):
    """Leading eigenvalues with the evidence for each.

    Attributes
    ----------
    values
        Ritz values, in the solver's order (descending, algebraically or by magnitude).
    residual_norms
        :math:`\\|M v_i - \\theta_i v_i\\|_2` for the unit Ritz vector :math:`v_i`.
    converged
        Per value: the residual criterion :data:`CRITERION` holds.
    iterations
        Per value: Krylov dimension (Lanczos) or power steps spent on that value.
    products_used
        All curvature-vector products, residual checks included.
    """

    kind: str
    quantity: str
    method: str
    which: str
    values: tuple[float, ...]
    residual_norms: tuple[float, ...]
    converged: tuple[bool, ...]
    iterations: tuple[int, ...]
    tol: float
    max_iter: int
    seed: int
    criterion: str = CRITERION
    loss_convention: str = LOSS_CONVENTION
    estimated: bool = True

    @property
    def all_converged(self) -> bool:
        """Every value met the residual criterion."""
        return all(self.converged)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (lists of plain floats/bools, no tensors)."""
        out = asdict(self)
        for key in ("values", "residual_norms", "converged", "iterations"):
            out[key] = list(out[key])
        return out


def top_eigenvalues(
    model: torch.nn.Module,
    x: Tensor,
    y: Tensor,
    k: int = 1,
    *,
    kind: str | CurvatureKind = "hessian",
    loss: str | LossKind = "cross_entropy",
    method: str | EigenMethod = "lanczos",
    max_iter: int = 100,
    tol: float = 1e-6,
    seed: int = DEFAULT_SEED,
    dtype: torch.dtype | None = None,
    require_converged: bool = False,
    output: OutputSelector = None,
    next_token: bool = False,
) -> TopEigenvalues:
    """The ``k`` leading eigenvalues of the Hessian, GGN or empirical Fisher on a probe batch.

    .. math::

        M v_i = \\lambda_i v_i, \\quad
        \\text{converged}_i \\iff \\|M v_i - \\theta_i v_i\\| \\le \\mathrm{tol}\\,\\max_j|\\theta_j|

    Parameters
    ----------
    model, x, y
        Classifier returning ``(n, C)`` logits and the fixed probe batch; state is preserved.
    k
        How many eigenvalues (``1 <= k <= number of trainable parameters``).
    kind
        ``"hessian"`` (signed), ``"ggn"`` or ``"empirical_fisher"``.
    loss
        ``"cross_entropy"`` (mean over the batch).
    method
        ``"lanczos"`` (k algebraically largest) or ``"power"`` (largest magnitude, deflated).
    max_iter
        Lanczos: largest Krylov dimension. Power: steps per eigenvalue.
    tol
        Relative residual tolerance of the convergence criterion. Float32 products rarely
        reach below ~1e-5; pass ``dtype=torch.float64`` for tighter tolerances.
    seed
        Seed of the private generator for start vectors (the global RNG is not consumed).
    dtype
        ``None`` (model's) or ``torch.float64`` (float64 copy).
    require_converged
        Refuse ``curvature_not_converged`` instead of returning unconverged values.
    output, next_token
        Logit selector for dict / ``ModelOutput`` models and the causal-LM shift for ``(n, T)``
        token labels (:mod:`stepscope.probe.outputs`; a sequence's loss sums its tokens).

    Returns
    -------
    TopEigenvalues
    """
    parsed_kind = parse_enum(CurvatureKind, kind, "curvature kind", "curvature_mode_invalid")
    parsed_method = parse_enum(EigenMethod, method, "eigen method", "curvature_mode_invalid")
    if not isinstance(k, int) or k < 1 or not isinstance(max_iter, int) or max_iter < 1:
        raise Refusal(
            "curvature_input_invalid",
            f"k and max_iter must be positive integers; got k={k!r}, max_iter={max_iter!r}.",
        )
    if not (tol > 0):
        raise Refusal("curvature_input_invalid", f"tol must be > 0; got {tol!r}.")
    with probe_operator(model, x, y, parsed_kind, loss, dtype, output, next_token) as op:
        if k > op.dim:
            raise Refusal(
                "curvature_input_invalid",
                f"k={k} exceeds the number of trainable parameters ({op.dim}).",
                [f"pass k <= {op.dim}"],
            )
        gen = torch.Generator().manual_seed(seed)
        if parsed_method is EigenMethod.LANCZOS:
            values, residuals, iterations, scale = _lanczos(op, k, max_iter, tol, gen)
        else:
            values, residuals, iterations, scale = _power(op, k, max_iter, tol, gen)
        converged = tuple(r <= tol * scale for r in residuals)
        result = TopEigenvalues(
            kind=parsed_kind.value,
            quantity=f"{parsed_kind.value}_top_eigenvalues",
            method=parsed_method.value,
            which=WHICH[parsed_method],
            values=tuple(values),
            residual_norms=tuple(residuals),
            converged=converged,
            iterations=tuple(iterations),
            tol=float(tol),
            max_iter=max_iter,
            seed=seed,
            **op.ledger(),
        )
    if require_converged and not result.all_converged:
        raise Refusal(
            "curvature_not_converged",
            f"{parsed_method.value} did not reach residual <= {tol} * ||M|| for all {k} values "
            f"(residuals {list(result.residual_norms)}).",
            ["raise max_iter", "use dtype=torch.float64", "loosen tol", "use method='lanczos'"],
        )
    return result


def _lanczos(
    op: CurvatureOperator, k: int, max_iter: int, tol: float, gen: torch.Generator
) -> tuple[list[float], list[float], list[int], float]:
    """Lanczos with full reorthogonalisation; explicit residuals for the top-k Ritz pairs.

    Memory: the basis holds ``min(max_iter, P)`` vectors of length ``P`` (full reorthogonalisation).
    """
    m_max = min(max_iter, op.dim)
    basis = torch.empty(m_max, op.dim, dtype=op.dtype, device=op.device)
    basis[0] = _unit_orthogonal(op.random_flat(gen), None)
    alphas: list[float] = []
    betas: list[float] = []  # betas[j] couples basis[j] and basis[j+1] (0.0 after a restart)
    theta = s = torch.empty(0)
    for j in range(m_max):
        w = op.matvec_flat(basis[j])
        alpha = float(basis[j] @ w)
        alphas.append(alpha)
        w = w - alpha * basis[j]
        if j > 0:
            w = w - betas[j - 1] * basis[j - 1]
        w = _project_out(w, basis[: j + 1])  # full reorthogonalisation
        beta = float(torch.linalg.vector_norm(w))
        theta, s = torch.linalg.eigh(_tridiagonal(alphas, betas))
        top = torch.argsort(theta, descending=True)[: min(k, j + 1)]
        scale = float(theta.abs().max())
        estimates = beta * s[-1, top].abs()
        if j + 1 >= k and bool((estimates <= 0.5 * tol * scale).all()):
            break
        if j + 1 == m_max:
            break
        tiny = beta <= 1e3 * torch.finfo(op.dtype).eps * max(scale, 1e-300)
        betas.append(0.0 if tiny else beta)
        # On an invariant subspace continue from a fresh orthogonal vector (block-diagonal T).
        if tiny:
            basis[j + 1] = _unit_orthogonal(op.random_flat(gen), basis[: j + 1])
        else:
            basis[j + 1] = w / beta
    order = torch.argsort(theta, descending=True)[:k]  # m_max >= 1, so theta is set
    used = basis[: theta.shape[0]]
    values, residuals = [], []
    for i in order.tolist():
        ritz = used.T @ s[:, i].to(used.dtype)
        ritz = ritz / torch.linalg.vector_norm(ritz)
        mv = op.matvec_flat(ritz)  # explicit residual, not the Lanczos estimate
        value = float(ritz @ mv)
        values.append(value)
        residuals.append(float(torch.linalg.vector_norm(mv - value * ritz)))
    scale = max(float(theta.abs().max()), *(abs(v) for v in values))
    return values, residuals, [int(theta.shape[0])] * k, scale


def _power(
    op: CurvatureOperator, k: int, max_iter: int, tol: float, gen: torch.Generator
) -> tuple[list[float], list[float], list[int], float]:
    """Power iteration with deflation by orthogonalisation against found vectors."""
    found: list[Tensor] = []
    values: list[float] = []
    residuals: list[float] = []
    iterations: list[int] = []
    scale = 0.0
    for _ in range(k):
        previous = torch.stack(found) if found else None
        v = _unit_orthogonal(op.random_flat(gen), previous)
        value = residual = float("nan")
        steps = 0
        for steps in range(1, max_iter + 1):
            w = op.matvec_flat(v)
            value = float(v @ w)
            residual = float(torch.linalg.vector_norm(w - value * v))  # same product, free
            scale = max(scale, abs(value))
            if residual <= tol * scale or steps == max_iter:
                break
            projected = _project_out(w, previous)
            norm = float(torch.linalg.vector_norm(projected))
            if norm == 0.0:
                break  # M v = 0 on the complement: value 0, residual already exact
            v = projected / norm
        found.append(v)
        values.append(value)
        residuals.append(residual)
        iterations.append(steps)
    return values, residuals, iterations, scale


def _project_out(w: Tensor, basis: Tensor | None) -> Tensor:
    """Remove the span of the orthonormal rows of ``basis`` (twice: enough in floating point)."""
    if basis is None or basis.shape[0] == 0:
        return w
    for _ in range(2):
        w = w - basis.T @ (basis @ w)
    return w


def _unit_orthogonal(w: Tensor, basis: Tensor | None) -> Tensor:
    w = _project_out(w, basis)
    return w / torch.linalg.vector_norm(w)


def _tridiagonal(alphas: list[float], betas: list[float]) -> Tensor:
    m = len(alphas)
    t = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if m > 1:
        off = torch.tensor(betas[: m - 1], dtype=torch.float64)
        t = t + torch.diag(off, 1) + torch.diag(off, -1)
    return t

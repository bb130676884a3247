"""analyze_curvature side by side with curvlinops (KFAC factors) and BackPACK (exact diagonals).

One checkpoint of the Ciresan MLP (784-2500-2000-1500-1000-500-10, ReLU after every hidden Linear)
on a probe of 128 examples, exact mode, float64. The peers compute the same KFAC factors
(curvlinops ``KFACLinearOperator``, ``fisher_type="empirical"`` and ``"type-2"``, weights of every
Linear) and the same exact weight diagonals (BackPACK ``SumGradSquared`` for the empirical Fisher,
``DiagGGNExact`` for the CE GGN), each on its own float64 copy. stepscope additionally computes the
Jacobian Gram family, every factor spectrum, the directional quotients and the output-space block;
the peers compute none of those, so the ratio is "everything stepscope reports" over "the subset
the peers can compute". Agreement is checked on the numbers both produce.

Run: ``.venv/bin/python benchmarks/curvature.py [--full] [--scale 4] [--n 128] [--repeats 2]``
(default: widths divided by ``--scale``; ``--full`` uses the Ciresan widths). Timings are wall
clock on this machine, never asserted.
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys
import time

import torch
from torch import nn

import stepscope as ss

CIRESAN = [784, 2500, 2000, 1500, 1000, 500, 10]


def build(widths: list[int], seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for i in range(len(widths) - 1):
        mods.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def best_of(repeats: int, fn):
    """Result, best wall time and best process CPU time of ``repeats`` runs.

    The box is shared, so the minimum is reported; CPU time (all threads of this process) is less
    sensitive to other jobs than wall time.
    """
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return out, (wall, cpu)


def peers(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict:
    """KFAC factors (curvlinops) and exact weight diagonals (BackPACK), float64, own copies."""
    import curvlinops
    from backpack import backpack, extend
    from backpack.extensions import DiagGGNExact, SumGradSquared

    ref = copy.deepcopy(model).double()
    xd = x.double()
    weights = [m.weight for m in ref if isinstance(m, nn.Linear)]
    out: dict = {}
    for fisher_type in ("empirical", "type-2"):
        op = curvlinops.KFACLinearOperator(
            ref,
            nn.CrossEntropyLoss(),
            weights,
            [(xd, y)],
            fisher_type=fisher_type,
            check_deterministic=False,
        )
        if hasattr(op, "compute_kronecker_factors"):
            op.compute_kronecker_factors()
        state = op.state_dict()
        out[fisher_type] = (state["input_covariances"], state["gradient_covariances"])
    bp_model = extend(copy.deepcopy(model).double())
    loss = extend(nn.CrossEntropyLoss())
    with backpack(DiagGGNExact(), SumGradSquared()):
        loss(bp_model(xd), y).backward()
    n = x.shape[0]
    out["diag"] = {
        str(i): (m.weight.sum_grad_squared * n, m.weight.diag_ggn_exact)  # mean loss: g_n / N
        for i, m in enumerate(bp_model)
        if isinstance(m, nn.Linear)
    }
    return out


def peers_with_spectra(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor) -> dict:
    """:func:`peers` plus the eigenvalues of every curvlinops factor (what our spectra cost)."""
    out = peers(model, x, y)
    out["spectra"] = {
        key: {
            name: (torch.linalg.eigvalsh(a), torch.linalg.eigvalsh(out[key][1][name]))
            for name, a in out[key][0].items()
        }
        for key in ("empirical", "type-2")
    }
    return out


def agreement(ours: dict, ref: dict) -> float:
    """Largest relative difference over KFAC traces/top eigenvalues and diagonal traces."""
    worst = 0.0
    for fam, key in (("empirical_fisher", "empirical"), ("ce_ggn", "type-2")):
        a_facs, g_facs = ref[key]  # keyed by module name; the two dicts differ in order
        for name, a in a_facs.items():
            g = g_facs[name]
            k = ours["layers"][name][fam]["kfac"]
            want = {
                "trace": (a.trace() * g.trace()).item(),
                "top_eigenvalue": (
                    ref["spectra"][key][name][0].max() * ref["spectra"][key][name][1].max()
                ).item(),
            }
            for stat, value in want.items():
                worst = max(worst, abs(k[stat] - value) / abs(value))
    for name, (ef_diag, ggn_diag) in ref["diag"].items():
        for fam, diag in (("empirical_fisher", ef_diag), ("ce_ggn", ggn_diag)):
            got = ours["layers"][name][fam]["weight"]
            for stat, value in (("trace", diag.sum()), ("diag_max", diag.max())):
                worst = max(worst, abs(got[stat] - value.item()) / abs(value.item()))
    return worst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="Ciresan widths (slow on 2 cores)")
    parser.add_argument("--scale", type=int, default=4, help="divide hidden widths by this")
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    widths = CIRESAN if args.full else [784, *(w // args.scale for w in CIRESAN[1:-1]), 10]
    model = build(widths, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.rand(args.n, 784, generator=gen)
    y = torch.randint(0, 10, (args.n,), generator=gen)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(
        f"widths {widths}, n={args.n}, threads={args.threads}, best of {args.repeats}, "
        f"load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}"
    )
    ss.analyze_curvature(build([8, 4, 3], 0), torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))
    ours, t_ours = best_of(args.repeats, lambda: ss.analyze_curvature(model, x, y))
    _, t_nodir = best_of(
        args.repeats, lambda: ss.analyze_curvature(model, x, y, include_directional=False)
    )
    _, t_peer = best_of(args.repeats, lambda: peers(model, x, y))
    ref, t_peer_spec = best_of(args.repeats, lambda: peers_with_spectra(model, x, y))
    meta = ours["metadata"]
    print(
        f"largest eigenproblem: {meta['largest_eigenproblem_dimension']} "
        f"({meta['largest_eigenproblem']}), approximate: {len(meta['approximate_eigenproblems'])}"
    )
    rows = [
        ("stepscope analyze_curvature (all families, spectra, directional, output)", t_ours),
        ("stepscope analyze_curvature (include_directional=False)", t_nodir),
        ("curvlinops KFAC (EF + type-2) + BackPACK diagonals (EF + GGN)", t_peer),
        ("  + dense eigenvalues of every curvlinops KFAC factor", t_peer_spec),
    ]
    print(f"{'':74s} {'wall s':>8s} {'cpu s':>8s}")
    for label, (wall, cpu) in rows:
        print(f"{label:74s} {wall:8.2f} {cpu:8.2f}")
    for i, kind in enumerate(("wall", "cpu")):
        print(
            f"ratio ({kind}) stepscope / peers: {t_ours[i] / t_peer[i]:.2f}x (without directional "
            f"{t_nodir[i] / t_peer[i]:.2f}x); vs peers + factor spectra: "
            f"{t_ours[i] / t_peer_spec[i]:.2f}x (without directional "
            f"{t_nodir[i] / t_peer_spec[i]:.2f}x)"
        )
    worst = agreement(ours, ref)
    print(
        f"agreement: max relative difference {worst:.2e} -> {'AGREE' if worst < 1e-8 else 'DIFFER'}"
    )


if __name__ == "__main__":
    main()

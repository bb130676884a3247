"""Curvature probes side by side with PyHessian, in one run: top eigenvalue and Hutchinson trace.

Prints the command line, each method's value, products used, wall time and the time ratios.
PyHessian's power iteration stops on a relative change of the eigenvalue between iterations
(``tol``); ours stop on the residual ``||Hv - theta v|| <= tol * |theta|`` and say whether they
converged. Timings are wall clock on this machine, not asserted anywhere.

Run: ``.venv/bin/python benchmarks/hessian.py [--width 64 --batch 128 --threads 1]``
"""

from __future__ import annotations

import argparse
import copy
import shlex
import sys
import time

import torch
from torch import nn

from stepscope.curvature.eigen import top_eigenvalues
from stepscope.curvature.estimators import trace
from stepscope.curvature.quadratic import directional


def _problem(args: argparse.Namespace) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(args.inputs, args.width), nn.ReLU(), nn.Linear(args.width, args.classes)
    )
    gen = torch.Generator().manual_seed(args.seed + 1)
    x = torch.randn(args.batch, args.inputs, generator=gen)
    y = torch.randint(0, args.classes, (args.batch,), generator=gen)
    return model, x, y


def _timed(fn, repeats: int = 5):
    """Best wall time of ``repeats`` runs (the first call of a process pays one-off set-up)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def _forward_backward_seconds(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    clone = copy.deepcopy(model)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        nn.functional.cross_entropy(clone(x), y).backward()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--iters", type=int, default=100, help="max iterations, both libraries")
    parser.add_argument("--samples", type=int, default=100, help="trace probes, both libraries")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("command:", shlex.join([sys.executable, *sys.argv]))
    model, x, y = _problem(args)
    n_params = sum(p.numel() for p in model.parameters())
    fb = _forward_backward_seconds(model, x, y)
    print(
        f"model: MLP {args.inputs}-{args.width}-{args.classes} ReLU, {n_params} parameters, "
        f"batch {args.batch}, float32, torch {torch.__version__}, {args.threads} thread(s); "
        f"one forward+backward {fb * 1e3:.2f} ms"
    )
    rows: list[tuple[str, str, float, int, float, str]] = []

    def add(name: str, what: str, value: float, products: int, seconds: float, note: str) -> None:
        rows.append((name, what, value, products, seconds, note))

    for method in ("lanczos", "power"):
        r, s = _timed(
            lambda m=method: top_eigenvalues(
                model, x, y, k=1, method=m, max_iter=args.iters, tol=1e-4
            )
        )
        note = f"converged={r.converged[0]} residual={r.residual_norms[0]:.2e} it={r.iterations[0]}"
        add(f"stepscope {method}", "top Hessian eig", r.values[0], r.products_used, s, note)
    r, s = _timed(
        lambda: top_eigenvalues(model, x, y, k=1, kind="ggn", max_iter=args.iters, tol=1e-4)
    )
    add(
        "stepscope lanczos (ggn)",
        "top GGN eig",
        r.values[0],
        r.products_used,
        s,
        f"converged={r.converged[0]}",
    )
    r, s = _timed(lambda: trace(model, x, y, samples=args.samples))
    add(
        "stepscope hutchinson",
        "Hessian trace",
        r.estimate,
        r.products_used,
        s,
        f"se={r.standard_error:.3g}",
    )
    r, s = _timed(lambda: trace(model, x, y, method="hutch++", samples=args.samples))
    add(
        "stepscope hutch++",
        "Hessian trace",
        r.estimate,
        r.products_used,
        s,
        f"se|sketch={r.standard_error:.3g}",
    )
    for kind in ("hessian", "ggn", "empirical_fisher"):
        r, s = _timed(lambda k=kind: directional(model, x, y, "mean_gradient", kind=k))
        add("stepscope directional", r.quantity, r.value, r.products_used, s, "mean gradient")

    try:
        import pyhessian  # noqa: F401 - its __init__ shadows the submodule name with a class

        pyhessian_module = sys.modules["pyhessian.hessian"]
    except Exception as exc:  # report, do not fail: the comparison is optional
        print(f"PyHessian skipped: does not import here ({exc!r})")
        pyhessian_module = None
    if pyhessian_module is not None:
        _pyhessian_rows(pyhessian_module, model, x, y, args, add)
    _report(rows)


def _pyhessian_rows(module, model, x, y, args, add) -> None:
    """PyHessian on a copy (it leaves graphs in ``.grad``), its HVPs counted by a wrapper."""
    counter = {"hvp": 0}
    original = module.hessian_vector_product

    def counted(*a, **k):
        counter["hvp"] += 1
        return original(*a, **k)

    module.hessian_vector_product = counted
    try:

        def build():
            torch.manual_seed(args.seed)  # PyHessian draws from the global RNG
            return module.hessian(
                copy.deepcopy(model), nn.CrossEntropyLoss(), data=(x, y), cuda=False
            )

        for tol, iters in ((1e-3, args.iters), (1e-6, 10 * args.iters)):

            def eig(tol=tol, iters=iters):
                counter["hvp"] = 0
                comp = build()
                return comp.eigenvalues(maxIter=iters, tol=tol, top_n=1)[0][0], counter["hvp"]

            (value, hvps), s = _timed(eig)
            note = f"stops on rel. change < {tol:g}; no residual, no convergence flag"
            add(f"pyhessian power tol={tol:g}", "top Hessian eig", value, hvps, s, note)

        def tr():
            counter["hvp"] = 0
            comp = build()
            traces = comp.trace(maxIter=args.samples, tol=1e-3)
            return sum(traces) / len(traces), counter["hvp"]

        (value, hvps), s = _timed(tr)
        note = "stops on rel. change of the running mean < 1e-3; no standard error"
        add("pyhessian hutchinson", "Hessian trace", value, hvps, s, note)
    finally:
        module.hessian_vector_product = original


def _report(rows) -> None:
    print(
        f"{'method':28s} {'quantity':36s} {'value':>11s} {'products':>8s} {'ms':>8s} "
        f"{'ms/prod':>8s}  note"
    )
    for name, what, value, products, seconds, note in rows:
        per = seconds * 1e3 / products if products else float("nan")
        print(
            f"{name:28s} {what:36s} {value:11.6g} {products:8d} {seconds * 1e3:8.1f} "
            f"{per:8.2f}  {note}"
        )
    by = {name: (value, products, seconds) for name, _, value, products, seconds, _ in rows}
    ref_name = "pyhessian power tol=1e-06"
    if ref_name in by:
        ref_value, ref_products, ref_seconds = by[ref_name]
        for name in ("stepscope lanczos", "stepscope power"):
            value, products, seconds = by[name]
            print(
                f"{name} vs {ref_name}: time ratio {seconds / ref_seconds:.2f}, "
                f"products ratio {products / ref_products:.2f}, "
                f"relative difference {abs(value - ref_value) / abs(ref_value):.2e}"
            )
        loose = by["pyhessian power tol=0.001"][0]
        lanczos = by["stepscope lanczos"][0]
        print(
            f"pyhessian tol=1e-3 value vs stepscope lanczos: {abs(loose - lanczos) / lanczos:.2e}"
        )
        _, products, seconds = by["stepscope hutchinson"]
        _, ref_products, ref_seconds = by["pyhessian hutchinson"]
        print(
            "stepscope hutchinson vs pyhessian hutchinson: time per product ratio "
            f"{(seconds / products) / (ref_seconds / ref_products):.2f}"
        )


if __name__ == "__main__":
    main()

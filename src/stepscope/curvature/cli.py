"""``stepscope curvature``: run a pinned checkpoint panel from the command line.

Example
-------
.. code-block:: bash

    stepscope curvature --model mypkg.models:make_mlp --checkpoint 0=ckpt/000.pt \\
        --checkpoint 1=ckpt/001.pt --probe probe.npz --pins pins.json --out panel/
    stepscope curvature-pin --source mypkg/models.py --checkpoint 0=ckpt/000.pt \\
        --probe probe.npz --out pins.json

Exit codes: 0 complete, 5 stopped with a ``budget_censored`` result, 3 refused.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from stepscope.curvature.offline import make_panel_pins, run_curvature_panel
from stepscope.curvature.pins import verify_source_file
from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal
from stepscope.history.files import atomic_write_json

EXIT_CENSORED = 5


def _factory(spec: str, pins: dict[str, Any]):
    """Load the factory, after checking its file against the pins (nothing runs before)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not attr:
        raise Refusal(
            "curvature_input_invalid",
            f"--model {spec!r} is not of the form module:function or path.py:function",
            ["e.g. --model mypkg.models:make_mlp"],
        )
    verify_source_file(_module_file(module_name), pins)
    try:
        if module_name.endswith(".py"):
            loaded = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if loaded is None or loaded.loader is None:
                raise ImportError(module_name)
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError, FileNotFoundError) as exc:
        raise Refusal(
            "curvature_input_invalid",
            f"cannot load model factory {spec!r}: {exc}",
            ["check the module path and function name"],
        ) from exc


def _module_file(module_name: str) -> str:
    """The file a module name or path would load, found without executing that module."""
    if module_name.endswith(".py"):
        return module_name
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        spec, why = None, str(exc)
    else:
        why = "not found"
    if spec is None or not spec.origin or not spec.has_location:
        raise Refusal(
            "curvature_input_invalid",
            f"cannot locate the source of module {module_name!r} ({why})",
            ["check the module path", "or pass --model path/to/file.py:function"],
        )
    return spec.origin


def _checkpoints(items: list[str]) -> dict[int, str]:
    out: dict[int, str] = {}
    for item in items or []:
        epoch, sep, path = item.partition("=")
        if not sep or not epoch.strip().isdigit():
            raise Refusal(
                "curvature_input_invalid",
                f"--checkpoint {item!r} is not EPOCH=PATH",
                ["e.g. --checkpoint 10=ckpt/epoch-010.pt"],
            )
        out[int(epoch)] = path
    return out


def _run(args: argparse.Namespace) -> int:
    pins: dict[str, Any] = json.loads(Path(args.pins).read_text())

    total = len(_checkpoints(args.checkpoint))

    def progress(epoch: int, path: Path, aggregate: dict[str, Any]) -> None:
        done = aggregate["completed"][-1]
        n = len(aggregate["completed"])
        print(
            f"[{n}/{total}] epoch {epoch}: {path} ({done['snapshot_duration_s']:.2f} s)",
            flush=True,
        )

    result = run_curvature_panel(
        _factory(args.model, pins),
        _checkpoints(args.checkpoint),
        args.probe,
        args.out,
        pins,
        mode=args.mode,
        samples=args.samples,
        seed=args.seed,
        probe_id=args.probe_id,
        eig_max_dimension=args.eig_max_dimension,
        include_directional=not args.no_directional,
        work_limit_s=args.work_limit_s,
        progress_callback=progress,
        hessian_top_k=args.hessian_top_k,
        trace_samples=args.trace_samples,
    )
    if result["status"] == "budget_censored":
        c = result["censored"]
        print(
            f"stepscope: budget_censored: projected {c['projected_s']:.1f} s > "
            f"{c['work_limit_s']:.1f} s; not run: {c['epochs_not_run']}",
            file=sys.stderr,
        )
        return EXIT_CENSORED
    print(f"complete: {len(result['completed'])} checkpoints in {args.out}")
    return 0


def _pin(args: argparse.Namespace) -> int:
    pins = make_panel_pins(args.source, _checkpoints(args.checkpoint), args.probe)
    atomic_write_json(Path(args.out), pins)
    print(f"pins written to {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``stepscope curvature`` (and ``stepscope curvature-pin``) to the CLI."""
    p = subparsers.add_parser(
        "curvature", help="offline curvature analysis over a pinned checkpoint panel"
    )
    p.add_argument("--model", required=True, help="model factory, module:function or file.py:fn")
    p.add_argument("--checkpoint", action="append", required=True, help="EPOCH=PATH (repeat)")
    p.add_argument("--probe", required=True, help="probe file (.npz or torch dict with x, y)")
    p.add_argument("--pins", required=True, help="pins JSON (stepscope curvature-pin)")
    p.add_argument("--out", required=True, help="new output directory")
    p.add_argument(
        "--mode",
        default="exact",
        choices=["exact", "sampled"],
        help="exact factors, or sampled (Monte-Carlo) ones (default: exact)",
    )
    p.add_argument(
        "--samples", type=int, default=1, help="samples per example in sampled mode (default: 1)"
    )
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="seed of the sampled estimators (default: %(default)s)",
    )
    p.add_argument("--probe-id", default=None, help="a name for the probe set in the results")
    p.add_argument(
        "--eig-max-dimension",
        type=int,
        default=1536,
        help="largest factor dimension eigendecomposed densely (default: 1536)",
    )
    p.add_argument(
        "--no-directional", action="store_true", help="skip the directional curvature quotients"
    )
    p.add_argument(
        "--work-limit-s",
        type=float,
        default=420.0,
        help="work budget in seconds; past it the panel stops with exit code 5 (default: 420)",
    )
    p.add_argument("--hessian-top-k", type=int, default=0, help="also Hessian top-k eigenvalues")
    p.add_argument("--trace-samples", type=int, default=0, help="also a Hutchinson Hessian trace")
    p.set_defaults(func=_run)
    q = subparsers.add_parser("curvature-pin", help="write sha256 pins for a curvature panel")
    q.add_argument("--source", action="append", required=True, help="model source file (repeat)")
    q.add_argument("--checkpoint", action="append", required=True, help="EPOCH=PATH (repeat)")
    q.add_argument("--probe", required=True, help="probe file (.npz or torch dict with x, y)")
    q.add_argument("--out", required=True, help="pins JSON path")
    q.set_defaults(func=_pin)

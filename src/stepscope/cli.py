"""The ``stepscope`` command line (also ``python -m stepscope``).

Each area registers its own sub-commands: a module listed in :data:`COMMAND_MODULES` exposes
``register(subparsers)`` which adds parsers whose ``func`` attribute takes the parsed namespace
and returns an exit code. Keeping registration in the areas keeps this file small.

Exit codes (also printed by ``stepscope --help``): ``0`` success; ``1`` the command ran and
found a failure (a checksum that does not hold, a tracker that failed); ``2`` usage error
(argparse); ``3`` refused: a :class:`stepscope.Refusal`, its ``[code]``, message and remedies on
stderr; ``5`` ``stepscope curvature`` stopped at its work budget (``budget_censored``).

Every sub-command gets an ``examples:`` epilog: its own, or the one in :data:`EXAMPLES`.

Example
-------
>>> from stepscope.cli import main
>>> main(["show", "no/such/run"])
3
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stepscope.errors import Refusal


def _open_run(path: str) -> object:
    from stepscope.run import open_run  # imported on use: `--help` stays light

    return open_run(path)


#: Modules that contribute sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES: tuple[str, ...] = (
    "stepscope.demo.cli",
    "stepscope.history.cli",
    "stepscope.events.cli",
    "stepscope.report.cli",
    "stepscope.curvature.cli",
    "stepscope.profile.cli",
    "stepscope.forensics.cli",
)


#: The ``stepscope --help`` epilog: exit codes and a first session.
EPILOG = """\
exit codes:
  0  success
  1  the command ran and found a failure (verify: a checksum fails; export: a tracker failed)
  2  usage error (unknown option, missing argument)
  3  refused: stepscope.Refusal; "[code] message" and remedies are printed on stderr
  5  curvature: the panel stopped at its work budget (budget_censored), results so far kept

examples:
  stepscope demo                                  # train the reference model, write runs/demo
  stepscope show runs/demo --json                 # the run record, sites, streams as JSON
  stepscope report runs/demo --out report.html
  stepscope export runs/demo --tensorboard tb     # then: tensorboard --logdir tb
  stepscope COMMAND --help                        # every option of one command
"""


#: Example epilogs for sub-commands whose area did not write its own.
EXAMPLES: dict[str, str] = {
    "demo": """\
examples:
  stepscope demo --quick                          # a tiny run (one seed, small widths)
  stepscope demo --seeds 0 1 2 --variants plain residual --out runs/demo
""",
    "show": """\
examples:
  stepscope show runs/demo
  stepscope show runs/demo --json | python -m json.tool
""",
    "verify": """\
examples:
  stepscope verify runs/demo                      # exit 0 only when every chunk's sha256 holds
""",
    "merge": """\
examples:
  stepscope merge runs/ddp/rank000 runs/ddp/rank001 --out runs/ddp-merged
""",
    "report": """\
examples:
  stepscope report runs/demo/plain-seed0 --out report.html
  stepscope report runs/a runs/b runs/c --out seeds.html --endpoints 0,990
""",
    "curvature": """\
examples:
  stepscope curvature-pin --source model.py --checkpoint 10=ckpt/e10.pt --probe probe.npz \\
      --out pins.json
  stepscope curvature --model model.py:build --checkpoint 10=ckpt/e10.pt --probe probe.npz \\
      --pins pins.json --out curvature/

exit codes: 0 complete, 3 refused (e.g. checkpoint_tampered), 5 budget_censored
""",
    "curvature-pin": """\
examples:
  stepscope curvature-pin --source model.py --checkpoint 10=ckpt/e10.pt --probe probe.npz \\
      --out pins.json
""",
}


def _add_epilogs(subparsers: argparse._SubParsersAction) -> None:
    for name, sub in subparsers.choices.items():
        if not sub.epilog and name in EXAMPLES:
            sub.epilog = EXAMPLES[name]
            sub.formatter_class = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every available area's sub-commands."""
    from stepscope import __version__

    parser = argparse.ArgumentParser(
        prog="stepscope",
        description="See inside PyTorch training, step by step.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue  # area not built in this version
            raise
        module.register(subparsers)
    if "verify" in subparsers.choices:  # `stepscope verify` checks what open_run().verify() does
        subparsers.choices["verify"].set_defaults(opener=_open_run)
    _add_epilogs(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Refusal as err:
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in err.message)
        print(f"stepscope: refused [{err.code}]: {message}", file=sys.stderr)
        for remedy in err.remedies:
            print(f"  - {remedy}", file=sys.stderr)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

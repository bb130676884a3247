"""The ``stepscope`` command line (also ``python -m stepscope``).

Each area registers its own sub-commands: a module listed in :data:`COMMANDS` (or
:data:`COMMAND_MODULES`) exposes ``register(subparsers)`` which adds parsers whose ``func``
attribute takes the parsed namespace and returns an exit code. Keeping registration in the areas
keeps this file small.

Registration is lazy: ``stepscope --help`` is built from the :data:`COMMANDS` table alone (no
area is imported, so neither is torch), and a command's module is imported only when that command
runs or its own ``--help`` is asked for (``stepscope show`` imports the history reader, not the
trainer). A module listed only in :data:`COMMAND_MODULES` is imported every time.

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
import os
import sys
from collections.abc import Collection, Sequence

from stepscope._version import __version__
from stepscope.errors import Refusal
from stepscope.run import open_run  # imported on use: `--help` stays light


def _open_run(path: str) -> object:
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


#: Command -> (the module whose ``register(subparsers)`` adds it, its one-line summary in
#: ``stepscope --help``). The summary is the ``help=`` that module passes (a test keeps them equal).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "stepscope.demo.cli",
        "train the reference MLP (seeds x plain/residual) with telemetry, curvature and a report",
    ),
    "show": ("stepscope.history.cli", "print a run's record, sites, streams, steps, sizes"),
    "verify": ("stepscope.history.cli", "recompute every chunk sha256 (exit 0 only if all hold)"),
    "merge": ("stepscope.history.cli", "merge per-rank artifacts of one run"),
    "export": (
        "stepscope.events.cli",
        "replay a history artifact into TensorBoard, JSONL and/or W&B (offline)",
    ),
    "report": (
        "stepscope.report.cli",
        "write a self-contained HTML report (plots embedded) over run artifacts",
    ),
    "curvature": (
        "stepscope.curvature.cli",
        "offline curvature analysis over a pinned checkpoint panel",
    ),
    "curvature-pin": ("stepscope.curvature.cli", "write sha256 pins for a curvature panel"),
    "profile": (
        "stepscope.profile.cli",
        "print the hot path of a saved torch.profiler chrome trace",
    ),
    "spikes": (
        "stepscope.forensics.cli",
        "flight-recorder triggers and the layers that left their range first",
    ),
}


#: The ``stepscope --help`` epilog: exit codes and a first walk-through. Every example runs as printed
#: (tests/test_newcomer.py runs each one twice in a fresh directory).
EPILOG = """\
exit codes:
  0  success
  1  the command ran and found a failure (verify: a checksum fails; export: a tracker failed)
  2  usage error (unknown option, missing argument)
  3  refused: stepscope.Refusal; "[code] message" and remedies are printed on stderr
  5  curvature: the panel stopped at its work budget (budget_censored), results so far kept

A RUN is a run directory or a folder of runs, searched like `tensorboard --logdir`.

examples:
  stepscope demo                                  # train the reference study: runs/demo/<variant>-seed<N>
  stepscope show runs/demo                        # one line per run found under runs/demo
  stepscope show runs/demo --json                 # every run's record, sites, streams as JSON
  stepscope report runs/demo --out report.html    # one HTML report over the runs
  stepscope export runs/demo --tensorboard tb     # then: tensorboard --logdir tb
  stepscope show --help                           # every option of one command
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
  stepscope show runs/demo                        # a folder: one line per run under it
  stepscope show runs/demo/plain-seed0            # one run: record, sites, streams, scalars
  stepscope show runs/demo --json | python -m json.tool
""",
    "verify": """\
examples:
  stepscope verify runs/demo                      # exit 0 only when every chunk's sha256 holds
  stepscope verify runs/demo/plain-seed0          # one run
""",
    "merge": """\
examples:
  stepscope merge runs/ddp --out runs/ddp-merged  # every rank run under runs/ddp
  stepscope merge runs/ddp/rank000 runs/ddp/rank001 --out runs/ddp-pair
""",
    "report": """\
examples:
  stepscope report runs/demo --out report.html    # every run under runs/demo

--endpoints 0,50 picks the optimizer steps whose evaluation rows are compared.
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


def _register(module_name: str, subparsers: argparse._SubParsersAction) -> None:
    """Import an area's command module and let it add its sub-commands (absent areas are skipped)."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            return  # area not built in this version
        raise
    module.register(subparsers)


def build_parser(commands: Collection[str] = (), *, every: bool = False) -> argparse.ArgumentParser:
    """Build the argument parser; only ``commands`` (or ``every`` one) are built in full.

    The others are placeholders carrying their :data:`COMMANDS` summary, enough for
    ``stepscope --help`` and for argparse to accept the name; :func:`main` builds the one it runs.

    >>> "show  " in build_parser().format_help()  # listed, though its module is not imported
    True
    """
    parser = argparse.ArgumentParser(
        prog="stepscope",
        description="See inside PyTorch training, step by step.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"stepscope {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    lazy = {module for module, _ in COMMANDS.values()}
    wanted = {COMMANDS[c][0] for c in (COMMANDS if every else commands) if c in COMMANDS}
    for module_name in dict.fromkeys([*(m for m, _ in COMMANDS.values()), *COMMAND_MODULES]):
        if module_name in wanted or module_name not in lazy:
            _register(module_name, subparsers)
    for name, (_, summary) in COMMANDS.items():
        if name not in subparsers.choices:  # a placeholder: main() builds it before it runs
            subparsers.add_parser(name, help=summary, add_help=False)
    if "verify" in subparsers.choices:  # `stepscope verify` checks what open_run().verify() does
        subparsers.choices["verify"].set_defaults(opener=_open_run)
    _add_epilogs(subparsers)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv`` (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(argv)
    parser = build_parser([command] if command else [])
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `stepscope show RUN | head`: the reader left, no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own advice: stdout's flush at exit
        return 1
    except Refusal as err:
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in err.message)
        print(f"stepscope: refused [{err.code}]: {message}", file=sys.stderr)
        for remedy in err.remedies:
            print(f"  - {remedy}", file=sys.stderr)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

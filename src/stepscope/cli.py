"""The ``stepscope`` command line (also ``python -m stepscope``).

Each area registers its own sub-commands: a module listed in :data:`COMMAND_MODULES` exposes
``register(subparsers)`` which adds parsers whose ``func`` attribute takes the parsed namespace
and returns an exit code. Keeping registration in the areas keeps this file small.

Example
-------
>>> from stepscope.cli import main
>>> main(["--version"])  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stepscope.errors import Refusal

#: Modules that contribute sub-commands, in the order they appear in ``--help``.
COMMAND_MODULES: tuple[str, ...] = (
    "stepscope.demo.cli",
    "stepscope.history.cli",
    "stepscope.events.cli",
    "stepscope.report.cli",
    "stepscope.curvature.cli",
    "stepscope.profile.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every available area's sub-commands."""
    from stepscope import __version__

    parser = argparse.ArgumentParser(
        prog="stepscope", description="See inside PyTorch training, step by step."
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

"""Wall time of the command line a newcomer types first: --help, show, verify, export.

Each command runs as a whole process (``python -m stepscope ...``), ``--repeat`` times after one
warm-up, and the median, minimum and maximum wall seconds are printed with the CPU seconds
(user + system, from the operating system's accounting of the finished children). ``--vs REV``
runs the same commands against the sources of a git revision too (``git archive REV src`` into a
temporary folder, the compiled kernel copied beside it), side by side: old vs new.

The runs it reads come from ``stepscope demo --quick --no-report`` in a temporary folder (or
``--runs DIR``, a folder holding the demo's runs). Nothing is asserted: a shared machine is noisy,
so quote medians (docs/benchmarks.md holds the figures and the command that produced them).

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/cli.py --repeat 5 --vs main
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commands(runs: Path, scratch: Path) -> dict[str, list[str]]:
    """Name -> argv after ``python -m stepscope`` (the demo's runs under ``runs``)."""
    one = next(iter(sorted(runs.glob("*-seed*"))))
    return {
        "help": ["--help"],
        "show RUN": ["show", str(one)],
        "show FOLDER --json": ["show", str(runs), "--json"],
        "verify RUN": ["verify", str(one)],
        "export RUN --tensorboard": [
            "export",
            str(one),
            "--tensorboard",
            str(scratch / "tb"),
            "--overwrite",
            "--no-progress",
        ],
    }


def time_one(argv: list[str], src: Path, repeat: int) -> tuple[list[float], float]:
    """Wall seconds of each of ``repeat`` runs (after a warm-up) and the median CPU seconds."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "stepscope", *argv]
    walls, cpus = [], []
    for i in range(repeat + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:  # the first run warms the file cache
            walls.append(wall)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, statistics.median(cpus)


def old_sources(rev: str, into: Path) -> Path:
    """The ``src`` tree of git revision ``rev`` (with this checkout's compiled kernel)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for so in (ROOT / "src" / "stepscope" / "stats").glob("_stepscope_kernels*.so"):
        shutil.copy(so, into / "src" / "stepscope" / "stats")
    return into / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="counted runs per command")
    parser.add_argument("--vs", metavar="REV", help="also time the sources of this git revision")
    parser.add_argument("--runs", type=Path, help="a folder holding the demo's runs")
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="time only these (e.g. help 'show RUN')"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        runs = args.runs
        if runs is None:
            runs = scratch / "runs" / "demo"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "stepscope",
                    "demo",
                    "--quick",
                    "--no-report",
                    "--out",
                    str(runs),
                ],
                env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=True,
            )
        sources = {"new": ROOT / "src"}
        if args.vs:
            (scratch / "old").mkdir()
            sources = {f"old ({args.vs})": old_sources(args.vs, scratch / "old"), **sources}
        print(f"python -m stepscope COMMAND, {args.repeat} runs each after a warm-up")
        print(f"{'command':<28}" + "".join(f"{name:>34}" for name in sources))
        print(f"{'':<28}" + f"{'wall median (min-max), cpu':>34}" * len(sources))
        for name, argv in commands(runs, scratch).items():
            if args.only and name not in args.only:
                continue
            cells = []
            for src in sources.values():
                walls, cpu = time_one(argv, src, args.repeat)
                cells.append(
                    f"{statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
                    f"{cpu:.2f} s"
                )
            print(f"{name:<28}" + "".join(f"{c:>34}" for c in cells), flush=True)


if __name__ == "__main__":
    main()

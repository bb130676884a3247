"""``stepscope show|verify|merge``: inspect, check and merge history artifacts.

Example
-------
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> from stepscope.cli import main
>>> main(["verify", run])
ok: 2 chunks, ... checked in 1 commits
0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.history.discover import runs_at
from stepscope.history.merge import merge_ranks
from stepscope.history.reader import HistoryReader
from stepscope.history.vocab import Stream


def register(subparsers: Any) -> None:
    """Add the history sub-commands to the ``stepscope`` parser."""
    p = subparsers.add_parser("show", help="print a run's record, sites, streams, steps, sizes")
    p.add_argument("run", help="artifact directory, or a folder of runs (a table of them)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the same facts as one JSON object (for scripts); a folder: {path, runs: [...]}",
    )
    p.set_defaults(func=_show)
    p = subparsers.add_parser(
        "verify", help="recompute every chunk sha256 (exit 0 only if all hold)"
    )
    p.add_argument("run", help="artifact directory, or a folder of runs (each verified)")
    p.set_defaults(func=_verify)
    p = subparsers.add_parser("merge", help="merge per-rank artifacts of one run")
    p.add_argument("runs", nargs="+", help="rank artifact directories, or a folder holding them")
    p.add_argument("--out", required=True, help="output artifact directory (must not exist)")
    p.set_defaults(func=_merge)


def escape(text: object) -> str:
    r"""``text`` with every non-printable character (terminal escapes, newlines) backslash-escaped.

    >>> escape("fc\x1b[2J\n")
    'fc\\x1b[2J\\n'
    """
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text)
    )


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _scalar_summary(names: list[str], limit: int = 6) -> str:
    """``scalars: N`` then names grouped by their first path component (at most ``limit`` shown)."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.split("/", 1)[0], []).append(name)
    lines = [f"scalars: {len(names)}"]
    for prefix, members in groups.items():
        shown = ", ".join(members[:limit]) + (
            f", ... (+{len(members) - limit} more)" if len(members) > limit else ""
        )
        lines.append(f"  {prefix + '/':<10} {len(members):>5}  {shown}")
    return "\n".join(lines)


def show_payload(h: Any) -> dict[str, Any]:
    """What ``stepscope show --json`` prints for an open history reader (JSON-safe).

    Keys: ``path``, ``run`` (the run record), ``segments``, ``steps`` (``committed``, ``first``,
    ``last``; ``None`` when empty), ``commits``, ``torn_tail_bytes``, ``sites``, ``streams``
    (rows, observed rows, histogram rows per stream), ``scalars`` (names) and ``sizes`` (bytes).
    """
    steps = h.steps
    obs = h.table("observations")
    hist = h.table("histograms")
    streams = {}
    for code, stream in enumerate(Stream, start=1):
        sel = obs["stream"] == code
        if sel.any():
            streams[stream.value] = {
                "rows": int(sel.sum()),
                "observed": int((obs["presence"][sel] == 1).sum()),
                "histograms": int((hist["stream"] == code).sum()),
            }
    return {
        "path": str(h.path),
        "run": h.run.to_dict(),
        "segments": [
            {
                "segment_id": s.segment_id,
                "parent_segment": s.parent_segment,
                "resumed_at_step": s.resumed_at_step,
            }
            for s in h.segments
        ],
        "steps": {
            "committed": len(steps),
            "first": int(steps[0]) if len(steps) else None,
            "last": int(steps[-1]) if len(steps) else None,
        },
        "commits": len(h.commits),
        "torn_tail_bytes": int(h.torn_tail_bytes),
        "sites": [
            {
                "site_id": s.site_id,
                "name": s.name,
                "module_type": s.module_type,
                "signature": s.signature,
                "ended_step": s.ended_step,
                "ended_reason": s.ended_reason,
            }
            for s in h.sites
        ],
        "streams": streams,
        "scalars": list(h.scalar_names),
        "sizes": {k: int(v) for k, v in h.sizes().items()},
    }


def _show_folder(folder: str, runs: list[Any], as_json: bool) -> int:
    """``stepscope show FOLDER``: one line per run found under it (or every payload as JSON)."""
    readers = [HistoryReader(run) for run in runs]
    if as_json:
        payloads = [show_payload(h) for h in readers]
        print(json.dumps({"path": folder, "runs": payloads}, indent=1, sort_keys=True))
        return 0
    print(f"{len(runs)} run(s) under {escape(folder)}\n")
    rows = [["run", "id", "steps", "sites", "scalars", "size"]]
    for run, h in zip(runs, readers):
        steps = h.steps
        span = f"{len(steps)} ({steps[0]}..{steps[-1]})" if len(steps) else "0"
        size = _human(float(sum(h.sizes().values())))
        rows.append(
            [
                escape(run),
                escape(h.run.run_id),
                span,
                str(len(h.sites)),
                str(len(h.scalar_names)),
                size,
            ]
        )
    print(_table(rows))
    print(f"\none run in full: stepscope show {escape(runs[0])}")
    return 0


def _show(args: argparse.Namespace) -> int:
    runs = runs_at([args.run], "show")
    if runs != [Path(args.run)]:  # a folder of runs
        return _show_folder(args.run, runs, args.json)
    h = HistoryReader(args.run)
    payload = show_payload(h)
    if args.json:
        print(json.dumps(payload, indent=1, sort_keys=True))
        return 0
    r = h.run
    steps = h.steps
    print(f"run {escape(r.run_id)}  ({escape(h.path)})")
    print(
        f"  segments   {len(h.segments)}: "
        + ", ".join(
            escape(s.segment_id)
            + (f" (resumed at {s.resumed_at_step})" if s.parent_segment else "")
            for s in h.segments
        )
    )
    print(f"  rank/world {r.rank}/{r.world_size}  device {escape(r.device)}")
    print(f"  model      {escape(r.model_fingerprint or 'not recorded')}")
    print("  packages   " + ", ".join(f"{escape(k)} {escape(v)}" for k, v in r.packages.items()))
    span = f"{steps[0]}..{steps[-1]}" if len(steps) else "none"
    print(f"  steps      {len(steps)} committed ({span}), {len(h.commits)} commits")
    if h.torn_tail_bytes:
        print(f"  torn tail  {h.torn_tail_bytes} bytes of an unfinished commit ignored")
    print()
    rows = [["site", "name", "type", "signature", "ended"]]
    for s in h.sites:
        ended = f"{s.ended_step} ({s.ended_reason})" if s.ended_step is not None else "-"
        rows.append([str(s.site_id), s.name, s.module_type, s.signature, ended])
        rows[-1] = [escape(c) for c in rows[-1]]
    print(_table(rows))
    print()
    rows = [["stream", "rows", "observed", "histograms"]]
    for stream, n in payload["streams"].items():
        rows.append([stream, str(n["rows"]), str(n["observed"]), str(n["histograms"])])
    print(_table(rows) if len(rows) > 1 else "no observations committed")
    if h.scalar_names:
        print("\n" + _scalar_summary([escape(n) for n in h.scalar_names]))
    print()
    sizes = h.sizes()
    print(
        "sizes: "
        + ", ".join(f"{k} {_human(v)}" for k, v in sizes.items())
        + f"; total {_human(float(np.sum(list(sizes.values()))) if sizes else 0)}"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    # the top-level CLI passes stepscope.open_run (evaluations and runlog.json checked too):
    # the same verification as open_run(path).verify(); this layer alone has the plain reader
    opener = getattr(args, "opener", None) or HistoryReader
    runs = runs_at([args.run], "verify")
    if runs == [Path(args.run)]:
        return _verify_one(runs[0], opener)
    failed = []
    for run in runs:
        print(f"{escape(run)}:")
        if _verify_one(run, opener):
            failed.append(run)
    print(
        f"{len(failed)} of {len(runs)} runs FAILED: " + ", ".join(escape(r) for r in failed)
        if failed
        else f"all {len(runs)} runs ok"
    )
    return 1 if failed else 0


def _verify_one(run: Path, opener: Any) -> int:
    h = opener(run)
    report = h.verify()
    for name, code, message in report.failures:
        print(f"FAIL {escape(name)}: [{code}] {escape(message)}")
    if report.orphans:
        print(
            f"note: {len(report.orphans)} uncommitted file(s) in chunks/ (ignored): "
            + ", ".join(escape(o) for o in report.orphans[:5])
        )
    if not h.catalog_confirmed:
        print("note: catalog.json is newer than the last commit (a killed writer); unconfirmed")
    if h.torn_tail_bytes:
        print(f"note: {h.torn_tail_bytes} bytes of an unfinished commit ignored (torn tail)")
    status = "ok" if report.ok else f"{len(report.failures)} FAILED"
    print(
        f"{status}: {report.checked_files} chunks, {_human(report.checked_bytes)} checked "
        f"in {len(h.commits)} commits"
    )
    return 0 if report.ok else 1


def _merge(args: argparse.Namespace) -> int:
    runs = runs_at(args.runs, "merge")
    out = merge_ranks(runs, args.out)
    print(f"merged {len(runs)} rank artifacts into {out}")
    return 0

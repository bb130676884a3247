"""Mutation campaign against history artifacts: correct data or a coded Refusal, nothing else.

Run (from the repository root)::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/artifact_fuzz.py --mutants 2000 --seed 0

Two base runs are written (a *closed* run, and a *killed* one whose writer never closed), each
with every file kind of ``stepscope.history.v1``: ``manifest.json``, ``catalog.json``,
``index.json``, the segment's index log, chunks of all four tables (histograms included) and
``evals.log``. Each mutant copies one base, applies one seeded mutation to one file — a bit or byte
flip, a truncation, a deletion, appended junk, random bytes, a swapped file kind (directory, FIFO,
link to ``/dev/zero``/``/dev/urandom``, a link loop, a link out of the run), a hostile JSON value
(``10**400``, ``-1``, ``NaN``, wrong types, huge strings, nested lists), a hostile chunk field
value or row-count claim — and, for half of the crafted edits, *re-signs* the artifact (log rows,
chunk sha256 and sizes, seals, manifest/catalog/index sha256) as a forger would. Then it opens the
mutant, reads every table, series and evaluation, and runs ``verify``. One mutant in five is a
*self-contradictory* re-signed edit (:func:`contradict`: a row repeated with its ``seq``
renumbered, a stream relabelled, two commits' entries or chunk files swapped, a step range,
``n_steps`` or site range rewritten, a chunk renamed as another commit's); those must be refused
(``forged`` does not apply to them). Outcomes:

``same``
    the data read equals the base (or, for the killed base, a committed prefix of it).
``refused``
    a :class:`stepscope.Refusal` with a code (counted per code).
``disclosed``
    the data differs but the reader disclosed why (``catalog_confirmed`` False on a killed run).
``forged``
    a re-signed mutant read as its new, in-vocabulary content: sha256 checksums detect damage,
    they are not a signature, so a forger who recomputes them writes a valid artifact.
``WRONG``, ``RAW``, ``HANG``, ``ALLOC``
    failures: different data read silently, a raw exception, a read over 5 s, or a traced
    allocation above 64 MiB plus 8x the artifact's bytes.

The test suite runs the same engine on a bounded number of seeds
(``tests/history/test_fuzz.py``); this script is the longer campaign whose counts
``docs/history.md`` reports.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from stepscope import Refusal
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.files import encode_log_row, json_sha256, log_extent
from stepscope.run import open_run  # the reader with the run log's evals.log
from stepscope.runlog import EvalRecord
from stepscope.runlog.sink import DiskSink
from stepscope.stats import SPINE_WIDTH, HistogramDescriptor

N_STEPS, N_SITES = 7, 3
HANG_SECONDS = 5.0
FAILURES = ("WRONG", "RAW", "HANG", "ALLOC")
HOSTILE = [10**400, -1, -(10**30), 2**63, 1e308, float("nan"), None, True, "", "x" * 5000,
           [[[[]]]], {"a": 1}, "../../etc/passwd", 0, 1.5]  # fmt: skip


def build_base(path: Path, kind: str) -> None:
    """A small run with every file kind; ``kind="killed"`` never closes (no seal, pending rows)."""
    w = HistoryWriter(path, commit_steps=2, commit_seconds=None)
    width = HistogramDescriptor.from_dict(dict(w.run.histogram_descriptor)).width
    rows = DiskSink(w)
    ids = [w.register_site(f"blocks.{i}.fc", "torch.nn.Linear", "f32[*,8]") for i in range(N_SITES)]
    rng = np.random.default_rng(7)
    for step in range(N_STEPS):
        spines = np.zeros((N_SITES, SPINE_WIDTH))
        spines[:, :2] = 8
        spines[:, 7:] = rng.normal(size=(N_SITES, SPINE_WIDTH - 7))
        hist = np.zeros((N_SITES, width), np.int64)
        hist[:, width // 2] = 8
        act = ObservationBatch.observed(
            "activation", "forward", ids, spines, hist_rows=np.arange(N_SITES), histograms=hist
        )
        grad = ObservationBatch.observed(
            "gradient", "backward", ids, spines * 2, scale_grad="unscaled", disclosures=("amp",)
        )
        w.write_step(
            StepBlockRecord(step, examples_seen=8 * step), [act, grad], scalars={"loss": step}
        )
        if step % 3 == 0:
            rows.write_eval(EvalRecord("validation", {"ce": 1.0 / (step + 1)}, optimizer_step=step))
    if kind == "closed":
        w.close()
    else:
        w._unlock()  # as after a SIGKILL: the log is unsealed, the last step never committed


def _digest(parts: list[Any]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.tobytes() if isinstance(p, np.ndarray) else repr(p).encode())
    return h.hexdigest()


def data_digest(h: Any, upto: int | None = None) -> str:
    """A digest of everything readable at steps ``<= upto`` (all when None)."""
    parts: list[Any] = [
        [s.to_dict() for s in h.sites],
        list(h.scalar_names),
        list(h.disclosures),
    ]
    for table in ("steps", "observations", "histograms", "scalars"):
        arr = h.table(table)
        if upto is not None:
            arr = arr[arr["step"] <= upto]
        arr = np.sort(
            arr, order=[n for n in ("step", "site", "stream", "name") if n in arr.dtype.names]
        )
        parts.append(arr)
    parts.append([repr(b) for b in h.step_blocks() if upto is None or b.optimizer_step <= upto])
    for s in h.sites:
        for rec in h.observations(s.site_id):
            if upto is None or rec.step <= upto:
                parts.append(repr(rec))
    return _digest(parts)


def evals_digest(h: Any, first: int | None = None) -> str:
    recs = [r.to_dict() for r in h.evals()]
    return _digest(recs if first is None else recs[:first])


class _Hang(Exception):
    pass


def _alarm(*_: Any) -> None:
    raise _Hang


def read_outcome(path: Path) -> tuple[str, str, Any]:
    """``(outcome, detail, reader-or-None)`` of reading everything in ``path``."""
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    limit = (64 << 20) + 8 * size
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    tracemalloc.start()
    try:
        h = open_run(path)
        digest = (data_digest(h), evals_digest(h))
        report = h.verify()
        h.series(h.sites[0] if h.sites else "0", "activation", "mean")  # site 0, by record
        outcome: tuple[str, str, Any] = ("read", "", (h, digest, report))
    except Refusal as exc:
        outcome = ("refused", exc.code, None)
    except _Hang:
        outcome = ("HANG", "", None)
    except MemoryError:
        outcome = ("ALLOC", "MemoryError", None)
    except Exception as exc:
        outcome = ("RAW", f"{type(exc).__name__}: {str(exc)[:200]}", None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if peak > limit:
        return ("ALLOC", f"peak {peak} > {limit}", None)
    return outcome


# -- mutations ----------------------------------------------------------------------------------
def _files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file() and p.name != "writer.lock")


def _leaf_paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _leaf_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _leaf_paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        obj = obj[k]
    if value is _DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


_DELETE = object()


def _hostile_json(rng: random.Random, obj: Any) -> Any:
    paths = _leaf_paths(obj)
    if not paths:
        return HOSTILE[rng.randrange(len(HOSTILE))]
    path = paths[rng.randrange(len(paths))]
    choice = rng.random()
    value = _DELETE if choice < 0.15 else HOSTILE[rng.randrange(len(HOSTILE))]
    _set(obj, path, value)
    return obj


def _dumps(obj: Any) -> str:
    return json.dumps(obj, allow_nan=True)


def mutate_json_file(rng: random.Random, path: Path) -> str:
    obj = json.loads(path.read_text())
    _hostile_json(rng, obj)
    path.write_text(_dumps(obj))
    return "json_value"


def mutate_log(rng: random.Random, path: Path) -> str:
    lines = path.read_bytes().splitlines(keepends=True)
    if not lines:
        path.write_bytes(b"0" * 64 + b" {}\n")
        return "log_empty_row"
    i = rng.randrange(len(lines))
    op = rng.choice(["value", "delete_row", "swap_rows", "dup_row"])
    if op == "value":  # the edited row is re-encoded with its own new sha256: a forgery
        payload = json.loads(lines[i].split(b" ", 1)[1])
        lines[i] = encode_log_row(_hostile_json(rng, payload))
        path.write_bytes(b"".join(lines))
        return "log_value+rowsigned"
    elif op == "delete_row":
        del lines[i]
    elif op == "swap_rows" and len(lines) > 1:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines.insert(i, lines[i])
    path.write_bytes(b"".join(lines))
    return f"log_{op}"


def mutate_chunk(rng: random.Random, path: Path) -> str:
    import io

    from stepscope.history.layout import npy_bytes

    arr = np.load(io.BytesIO(path.read_bytes()), allow_pickle=False).copy()
    op = rng.choice(["field", "field", "rows_claim", "reshape"])
    if op == "field" and len(arr):
        name = rng.choice(list(arr.dtype.names))
        col = arr[name]
        idx = rng.randrange(len(arr))
        kind = col.dtype.base.kind
        if kind == "f":
            val = rng.choice([np.nan, np.inf, -np.inf, -1.0, 1e308, 0.0])
        else:
            info = np.iinfo(col.dtype.base)
            val = rng.choice(
                [info.min, info.max, -1 if info.min < 0 else 0, 7, 255 % (info.max + 1)]
            )
        if col.ndim > 1:
            col[idx].flat[rng.randrange(col[idx].size)] = val
        else:
            col[idx] = val
        path.write_bytes(npy_bytes(arr))
    elif op == "rows_claim":
        raw = path.read_bytes()
        n = len(arr)
        claim = rng.choice([10**11, n + 1, max(n - 1, 0), 2**62])
        path.write_bytes(
            raw.replace(f"'shape': ({n},)".encode(), f"'shape': ({claim},)".encode(), 1)
        )
    else:
        path.write_bytes(npy_bytes(np.stack([arr, arr]) if len(arr) else arr.reshape(0, 1)))
    return f"chunk_{op}"


def mutate_bytes(rng: random.Random, path: Path, outside: Path) -> str:
    raw = path.read_bytes()
    op = rng.choice(["flip", "flip", "truncate", "delete", "append", "random", "kind"])
    if op == "flip" and raw:
        b = bytearray(raw)
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
        path.write_bytes(bytes(b))
    elif op == "truncate":
        path.write_bytes(raw[: rng.randrange(len(raw) + 1)])
    elif op == "delete":
        path.unlink()
    elif op == "append":
        path.write_bytes(raw + rng.choice([b"\n", b"junk", rng.randbytes(40), b"x" * 100 + b"\n"]))
    elif op == "random":
        path.write_bytes(rng.randbytes(len(raw)))
    else:
        kind = rng.choice(["dir", "fifo", "/dev/zero", "/dev/urandom", "loop", "outside"])
        path.unlink()
        if kind == "dir":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "loop":
            os.symlink(path.name, path)
        elif kind == "outside":
            outside.write_bytes(raw)
            os.symlink(outside, path)
        else:
            os.symlink(kind, path)
        return f"kind_{kind}"
    return op


def resign(run: Path) -> None:
    """Make every checksum match again, as a forger would: rows, chunks, seals, index."""
    chunk_meta = {}
    for p in (run / "chunks").iterdir() if (run / "chunks").is_dir() else []:
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            chunk_meta[p.name] = (hashlib.sha256(data).hexdigest(), len(data))
    logs = [p for p in (run / "index").glob("*.log")] if (run / "index").is_dir() else []
    evals = run / "evals.log"
    for log in [*logs, evals]:
        if not log.is_file() or log.is_symlink():
            continue
        out = []
        for line in log.read_bytes().splitlines(keepends=True):
            try:
                row = json.loads(line.split(b" ", 1)[1])
                for f in row.get("files", []) if isinstance(row, dict) else []:
                    if isinstance(f, dict) and f.get("name") in chunk_meta:
                        f["sha256"], f["bytes"] = chunk_meta[f["name"]]
                out.append(encode_log_row(row) if line.endswith(b"\n") else line)
            except (ValueError, IndexError, TypeError, AttributeError):
                out.append(line)
        log.write_bytes(b"".join(out))
    index_path = run / "index.json"
    try:
        index = json.loads(index_path.read_text())
        index.pop("sha256", None)
        for key, name in (("manifest_sha256", "manifest.json"), ("catalog_sha256", "catalog.json")):
            p = run / name
            if (key in index or key == "manifest_sha256") and p.is_file() and not p.is_symlink():
                index[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        if isinstance(index.get("sealed"), dict):
            for key in list(index["sealed"]):
                p = run / key
                if p.is_file() and not p.is_symlink():
                    index["sealed"][key] = log_extent(p)
        index["sha256"] = json_sha256(index)
        index_path.write_text(_dumps(index))
    except (OSError, ValueError, TypeError, AttributeError):
        pass


def _rows_of(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line.split(b" ", 1)[1]) for line in log.read_bytes().splitlines()]


def _swap_on_disk(chunks: Path, a: str, b: str) -> None:
    tmp = chunks / "swap.tmp"
    (chunks / a).rename(tmp)
    (chunks / b).rename(chunks / a)
    tmp.rename(chunks / b)


def contradict(rng: random.Random, run: Path) -> str:
    """Make the index contradict itself (or its chunks) in one seeded way; the caller re-signs.

    Each edit is what a forger who recomputes every checksum could write, yet the artifact is
    self-contradictory: a reader must refuse it (``history_artifact_inconsistent`` or another
    code), never read it as data (outcome ``forged`` is a failure for these).
    """
    log = sorted((run / "index").glob("*.log"))[0]
    rows = _rows_of(log)
    chunks = run / "chunks"
    op = rng.choice(
        ["repeat_renumbered", "relabel_stream", "swap_entries", "swap_chunks", "shift_range",
         "n_steps", "site_range", "rename_chunk"]
    )  # fmt: skip
    i, j = rng.sample(range(len(rows)), 2)
    by_table = lambda r, t: [f for f in r["files"] if f["table"] == t]  # noqa: E731
    if op == "repeat_renumbered":
        rows.append({**rows[i], "seq": len(rows)})
    elif op == "relabel_stream":
        obs = by_table(rows[i], "observations")
        a, b = obs[0], obs[-1] if len(obs) > 1 else obs[0]
        if a is b:
            a["stream"] = "update" if a["stream"] != "update" else "parameter"
        else:
            a["stream"], b["stream"] = b["stream"], a["stream"]
    elif op in ("swap_entries", "swap_chunks"):
        table = rng.choice(["steps", "observations", "histograms", "scalars"])
        fa, fb = by_table(rows[i], table), by_table(rows[j], table)
        if not fa or not fb:
            fa, fb = by_table(rows[i], "steps"), by_table(rows[j], "steps")
        a, b = fa[0], fb[0]
        keys = [
            k
            for k in ("name", "sha256", "bytes", "rows", "site_lo", "site_hi", "counts_dtype")
            if k in a and k in b
        ]
        if op == "swap_entries":
            for k in keys:
                a[k], b[k] = b[k], a[k]
        else:
            _swap_on_disk(chunks, a["name"], b["name"])
    elif op == "shift_range":
        rows[i]["step_lo"] += 1000
        rows[i]["step_hi"] += 1000
    elif op == "n_steps":
        rows[i]["n_steps"] += rng.choice([1, -1]) if rows[i]["n_steps"] > 1 else 1
    elif op == "site_range":
        f = rng.choice([f for f in rows[i]["files"] if "site_lo" in f])
        f["site_lo"] = f["site_hi"] = f["site_hi"] + 1
    else:  # a chunk renamed as another commit's (the file moved with it)
        f = rng.choice(rows[i]["files"])
        new = f"{rows[j]['segment']}-{rows[j]['seq'] + 50:07d}-{f['table']}.npy"
        (chunks / f["name"]).rename(chunks / new)
        f["name"] = new
    log.write_bytes(b"".join(encode_log_row(r) for r in rows))
    return f"contradict_{op}"


def mutate(rng: random.Random, run: Path, outside: Path, contradiction: bool = False) -> str:
    """Apply one seeded mutation to one file of ``run``; returns its name.

    ``contradiction`` (or one mutant in five): a re-signed self-contradictory edit
    (:func:`contradict`), named ``...+contradiction``.
    """
    if contradiction or rng.random() < 0.2:
        name = contradict(rng, run)
        resign(run)
        return f"index:{name}+resigned+contradiction"
    files = _files(run)
    target = files[rng.randrange(len(files))]
    rel = target.relative_to(run).as_posix()
    crafted = rng.random() < 0.5
    try:
        if crafted and target.suffix == ".json":
            name = mutate_json_file(rng, target)
        elif crafted and target.suffix == ".log":
            name = mutate_log(rng, target)
        elif crafted and target.suffix == ".npy":
            name = mutate_chunk(rng, target)
        else:
            name = mutate_bytes(rng, target, outside)
            crafted = False
    except (ValueError, UnicodeDecodeError, IndexError, KeyError, TypeError):
        name = mutate_bytes(rng, target, outside)
        crafted = False
    if crafted and rng.random() < 0.5:
        resign(run)
        name += "+resigned"
    return f"{rel.split('/')[0] if '/' in rel else rel}:{name}"


class Campaign:
    """Bases built once; :meth:`run_one` classifies one seeded mutant."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.bases: dict[str, Path] = {}
        self.expected: dict[str, tuple[set[str], set[str]]] = {}
        for kind in ("closed", "killed"):
            base = workdir / f"base-{kind}"
            build_base(base, kind)
            h = open_run(base)
            steps = h.steps.tolist()
            uptos = {None} if kind == "closed" else {-1, *steps}
            n_evals = len(h.evals())
            firsts = {None} if kind == "closed" else set(range(n_evals + 1))
            self.expected[kind] = (
                {data_digest(h, u) for u in uptos},
                {evals_digest(h, f) for f in firsts},
            )
            self.bases[kind] = base
        self.counts: collections.Counter = collections.Counter()
        self.codes: collections.Counter = collections.Counter()
        self.targets: collections.Counter = collections.Counter()  # mutated file kinds
        self.failures: list[tuple[int, str, str, str]] = []

    def run_one(self, seed: int, contradiction: bool = False) -> tuple[str, str]:
        rng = random.Random(seed)
        kind = rng.choice(["closed", "killed"])
        mutant = self.workdir / f"m{seed}"
        shutil.copytree(self.bases[kind], mutant, symlinks=True)
        outside = self.workdir / f"outside{seed}"
        try:
            name = mutate(rng, mutant, outside, contradiction)
            self.targets[name.split(":")[0]] += 1
            outcome, detail, got = read_outcome(mutant)
            if outcome == "read":
                h, (data, evals), _report = got
                data_ok, evals_ok = self.expected[kind]
                if data in data_ok and evals in evals_ok:
                    outcome = "same"
                elif name.endswith("+contradiction"):  # checksums hold, the index lies
                    outcome, detail = "WRONG", "a self-contradictory artifact read as data"
                elif kind == "killed" and not h.catalog_confirmed:
                    outcome = "disclosed"
                elif name.endswith(("+resigned", "+rowsigned")):
                    outcome = "forged"  # self-consistent new content: checksums are not keys
                else:
                    outcome, detail = "WRONG", f"data {data in data_ok} evals {evals in evals_ok}"
            self.counts[outcome] += 1
            if outcome == "refused":
                self.codes[detail] += 1
            if outcome in FAILURES:
                self.failures.append((seed, kind, name, f"{outcome} {detail}"))
            return outcome, f"{kind} {name} {detail}"
        finally:
            _remove(mutant)
            _remove(outside)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        for p in path.rglob("*"):
            if p.is_symlink() or (p.exists() and not p.is_dir()) or _is_fifo(p):
                p.unlink()
        shutil.rmtree(path, ignore_errors=True)


def _is_fifo(p: Path) -> bool:
    import stat

    try:
        return stat.S_ISFIFO(os.lstat(p).st_mode)
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mutants", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        c = Campaign(Path(tmp))
        for seed in range(args.seed, args.seed + args.mutants):
            c.run_one(seed)
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"{args.mutants} mutants in {time.perf_counter() - t0:.0f} s")
    for outcome in ("same", "refused", "disclosed", "forged", *FAILURES):
        print(f"  {outcome:<10} {c.counts[outcome]}")
    print("mutated files: " + ", ".join(f"{k} {v}" for k, v in sorted(c.targets.items())))
    print("refusal codes: " + ", ".join(f"{k} {v}" for k, v in c.codes.most_common()))
    for f in c.failures[:30]:
        print("FAIL", *f)
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())

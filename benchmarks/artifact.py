"""Write/read cost of the history artifact next to TensorBoard and torchlens's history writer.

Run (from the repository root)::

    .venv/bin/python benchmarks/artifact.py                      # 200 sites x 4 streams x 200 steps
    .venv/bin/python benchmarks/artifact.py --steps 1250         # 1M observation rows
    PYTHONPATH=/path/to/unpacked/torchlens-wheel .venv/bin/python benchmarks/artifact.py

Every writer gets the same rows: ``sites x streams`` spine observations per step (15 float64
fields each) and a histogram for every site and stream every ``--hist-every`` steps. Each writer
runs in a forked child so its peak RSS growth (``VmHWM`` after ``clear_refs``) is its own.

- ``stepscope``: :class:`HistoryWriter.write_step` with one columnar batch per stream, fsync on
  (``durable``) and off; commit every ``--commit-steps`` steps; and fsync on with the
  ``stepscope-writer`` thread (``background=True``, the collector's default), where the caller's
  ``write_step`` only queues the step (its mean and worst time on the caller's thread are printed
  for each stepscope arm: what a training step pays). This loop writes back to back with no
  training between steps, so the thread can fall behind: the steps it could not queue are
  counted (``writer_behind``), as a real run's would be.
- ``tensorboard``: ``SummaryWriter.add_scalar`` for each of the 15 spine fields of every row and
  ``add_histogram_raw`` (non-empty buckets only) for each histogram; on ``--tb-steps`` steps.
- ``torchlens``: ``observability.HistoryWriter.append_block`` (one chunk per step, whole
  ``index.json`` rewritten per commit), on ``--tl-steps`` steps; skipped with the reason if
  torchlens does not import.

Rates are per observation row so runs of different lengths compare; times are wall-clock on a
shared CPU: compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stepscope import open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.stats import SPINE_FIELDS, HistogramDescriptor

STREAMS = [("activation", "forward", None), ("gradient", "backward", "unscaled"),
           ("parameter", "post_step", None), ("update", "post_step", None)]  # fmt: skip
DESC = HistogramDescriptor()


def make_data(n_sites: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Spine rows and sparse histogram rows shaped like real ones (reused every step)."""
    rng = np.random.default_rng(seed)
    spines = np.zeros((n_sites, len(SPINE_FIELDS)))
    n = rng.integers(1_000, 100_000, n_sites).astype(float)
    spines[:, 0] = spines[:, 1] = n
    spines[:, 3] = np.floor(n / 2)
    spines[:, 7:] = rng.normal(size=(n_sites, 8))
    hists = np.zeros((n_sites, DESC.width), np.int64)
    for i in range(n_sites):
        lo = rng.integers(150, 200)
        hists[i, lo : lo + 40] = rng.integers(0, 500, 40)
        hists[i, DESC.n_bins + lo : DESC.n_bins + lo + 40] = rng.integers(0, 500, 40)
    return spines, hists


def _rss_reset() -> int:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status("VmRSS")
    except OSError:
        return -1


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return -1


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def write_stepscope(
    path: Path, a: argparse.Namespace, durable: bool, background: bool = False
) -> dict:
    spines, hists = make_data(a.sites)
    base = _rss_reset()
    commits: list[float] = []
    calls: list[float] = []  # each write_step on the caller's thread
    t0 = time.perf_counter()
    with HistoryWriter(
        path,
        commit_steps=a.commit_steps,
        commit_seconds=None,
        durable=durable,
        background=background,
    ) as w:
        ids = np.array(
            [w.register_site(f"layers.{i}", "torch.nn.Linear", "f32[*]") for i in range(a.sites)]
        )
        for step in range(a.steps):
            hist = step % a.hist_every == 0
            batches = [
                ObservationBatch.observed(
                    s, ph, ids, spines + step, scale_grad=sg,
                    hist_rows=np.arange(a.sites) if hist else None,
                    histograms=hists if hist else None,
                )
                for s, ph, sg in STREAMS[: a.streams]
            ]  # fmt: skip
            c0 = time.perf_counter()
            committed = w.write_step(StepBlockRecord(step), batches)
            calls.append(time.perf_counter() - c0)
            if committed:
                commits.append(calls[-1])
    k = max(1, min(5, len(commits) // 2))
    return {
        "behind_steps": w.behind_steps,  # steps queued past the bound: cells writer_behind
        "call_mean_us": 1e6 * float(np.mean(calls)),
        "call_max_us": 1e6 * float(np.max(calls)),
        "seconds": time.perf_counter() - t0,
        "rss_growth": _status("VmHWM") - base,
        "first_commits_ms": 1e3 * float(np.mean(commits[:k])) if commits else 0.0,
        "last_commits_ms": 1e3 * float(np.mean(commits[-k:])) if commits else 0.0,
    }


def write_tensorboard(path: Path, a: argparse.Namespace) -> dict:
    from torch.utils.tensorboard import SummaryWriter

    spines, hists = make_data(a.sites)
    edges = DESC.edges()
    limits = np.concatenate([-edges[:-1][::-1], edges[1:], [0.0]])  # signed right edges + zero
    limits = np.clip(limits, -3e38, 3e38)
    order = np.argsort(limits[: 2 * DESC.n_bins])
    base = _rss_reset()
    t0 = time.perf_counter()
    w = SummaryWriter(str(path))
    for step in range(a.tb_steps):
        for s, _, _ in STREAMS[: a.streams]:
            rows = spines + step
            for i in range(a.sites):
                for f, name in enumerate(SPINE_FIELDS):
                    w.add_scalar(f"{s}/layers.{i}/{name}", rows[i, f], step)
                if step % a.hist_every == 0:
                    c = hists[i, : 2 * DESC.n_bins][order]
                    nz = np.flatnonzero(c)
                    w.add_histogram_raw(
                        f"{s}/layers.{i}", rows[i, 7], rows[i, 8], int(c.sum()), rows[i, 10],
                        rows[i, 11], limits[order][nz].tolist(), c[nz].tolist(), step,
                    )  # fmt: skip
    w.close()
    return {"seconds": time.perf_counter() - t0, "rss_growth": _status("VmHWM") - base}


def write_torchlens(path: Path, a: argparse.Namespace) -> dict:
    from torchlens.observability import _artifact as tla
    from torchlens.observability import _kernels as tlk
    from torchlens.observability import _schema as tls

    spines, hists = make_data(a.sites)
    desc = tlk.HistogramDescriptor()
    run = tls.RunRecord(run_id="bench", segment_id="s0")
    base = _rss_reset()
    t0 = time.perf_counter()
    w = tla.HistoryWriter(path, run)
    for i in range(a.sites):
        w.add_site(
            tls.SiteRecord(site_id=f"layers.{i}", kind="module", display_label=f"layers.{i}")
        )
    commit_times = []
    names = {"activation": "activation", "gradient": "param_grad", "parameter": "param",
             "update": "param_delta"}  # fmt: skip
    for step in range(a.tl_steps):
        obs = []
        for s, ph, sg in STREAMS[: a.streams]:
            s = names[s]
            for i in range(a.sites):
                r = spines[i] + step
                sp = tlk.SpineResult(
                    *(int(v) for v in r[:7]), *(float(v) for v in r[7:]), "float64"
                )
                sk = None
                if step % a.hist_every == 0:
                    h = hists[i]
                    sk = tlk.HistogramResult(desc, tuple(h[DESC.n_bins : 2 * DESC.n_bins].tolist()),
                                             tuple(h[: DESC.n_bins].tolist()))  # fmt: skip
                obs.append(
                    tls.ObservationRecord(step, f"layers.{i}", s, ph, "observed", sp, sk, sg)
                )
        c0 = time.perf_counter()
        block = tls.StepBlockRecord(segment_id="s0", global_step=step, provenance="explicit")
        w.append_block(tla.CommittedBlock(block, tuple(obs), step, step))
        commit_times.append(time.perf_counter() - c0)
    k = max(1, min(10, len(commit_times) // 2))
    return {
        "seconds": time.perf_counter() - t0,
        "rss_growth": _status("VmHWM") - base,
        "first_commits_ms": 1e3 * float(np.mean(commit_times[:k])),
        "last_commits_ms": 1e3 * float(np.mean(commit_times[-k:])),
    }


def _in_child(fn, *args) -> dict:
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()

    def run() -> None:
        try:
            child.send(fn(*args))
        except Exception as exc:  # report, do not hang the parent
            child.send({"error": f"{type(exc).__name__}: {exc}"})

    p = ctx.Process(target=run)
    p.start()
    out = parent.recv()
    p.join()
    return out


def read_stepscope(path: Path, a: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    h = open_run(path)
    obs = h.table("observations")
    full = time.perf_counter() - t0
    t0 = time.perf_counter()
    hist = h.table("histograms")
    full_hist = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = open_run(path).series(
        "layers.17", "gradient", "mean", steps=(a.steps // 2, a.steps // 2 + 49)
    )
    filtered = time.perf_counter() - t0
    t0 = time.perf_counter()
    ok = open_run(path).verify().ok
    verify = time.perf_counter() - t0
    return {"rows": len(obs), "hist_rows": len(hist), "full": full, "full_hist": full_hist,
            "filtered": filtered, "filtered_rows": len(s.steps), "verify": verify, "ok": ok}  # fmt: skip


def read_tensorboard(path: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    t0 = time.perf_counter()
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    full = time.perf_counter() - t0
    t0 = time.perf_counter()
    acc2 = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0})
    acc2.Reload()  # no way to read one tag without parsing every event
    acc2.Scalars("gradient/layers.17/mean")
    return {"full": full, "filtered": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sites", type=int, default=200)
    p.add_argument("--streams", type=int, default=4, choices=[1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--hist-every", type=int, default=10)
    p.add_argument("--commit-steps", type=int, default=32)
    p.add_argument("--tb-steps", type=int, default=10, help="keep a multiple of --hist-every")
    p.add_argument("--tl-steps", type=int, default=10, help="keep a multiple of --hist-every")
    p.add_argument("--keep", help="keep the artifacts under this directory")
    a = p.parse_args(argv)
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    root = Path(a.keep or tempfile.mkdtemp(prefix="ss-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    per_step = a.sites * a.streams
    results = {}
    for name, fn, args, steps in [
        ("stepscope (fsync)", write_stepscope, (root / "ss", a, True), a.steps),
        ("stepscope (no fsync)", write_stepscope, (root / "ss_nofsync", a, False), a.steps),
        ("stepscope (writer thread)", write_stepscope, (root / "ss_bg", a, True, True), a.steps),
        ("tensorboard", write_tensorboard, (root / "tb", a), a.tb_steps),
        ("torchlens", write_torchlens, (root / "tl", a), a.tl_steps),
    ]:
        if steps == 0:
            continue
        if name == "torchlens":
            try:
                import torchlens.observability._artifact  # noqa: F401
            except Exception as exc:
                print(f"torchlens: skipped ({type(exc).__name__}: {exc}); put an unpacked "
                      "torchlens wheel on PYTHONPATH to include it")  # fmt: skip
                continue
        r = _in_child(fn, *args)
        if "error" in r:
            print(f"{name}: failed: {r['error']}")
            continue
        r["rows"] = steps * per_step
        r["bytes"] = _dir_bytes(args[0])
        results[name] = r
    ours = results["stepscope (fsync)"]
    print(f"\n{a.sites} sites x {a.streams} streams, histograms every {a.hist_every} steps; "
          f"stepscope {a.steps} steps, tensorboard {a.tb_steps}, torchlens {a.tl_steps}\n")  # fmt: skip
    print(
        f"{'writer':26} {'rows':>9} {'rows/s':>10} {'MB/s':>7} {'B/row':>7} {'RSS+MB':>7} {'x ours':>7}"
    )
    for name, r in results.items():
        rate = r["rows"] / r["seconds"]
        print(f"{name:26} {r['rows']:9d} {rate:10.0f} {r['bytes'] / r['seconds'] / 1e6:7.1f} "
              f"{r['bytes'] / r['rows']:7.0f} {r['rss_growth'] / 2**20:7.1f} "
              f"{(ours['rows'] / ours['seconds']) / rate:7.2f}")  # fmt: skip
    for name in ("stepscope (fsync)", "stepscope (no fsync)"):
        r = results[name]
        print(f"\n{name} commit (write_step that committed, {a.commit_steps} steps): first "
              f"{r['first_commits_ms']:.1f} ms, last {r['last_commits_ms']:.1f} ms", end="")  # fmt: skip
    print()
    for name in ("stepscope (fsync)", "stepscope (no fsync)", "stepscope (writer thread)"):
        r = results[name]
        print(f"{name}: write_step on the caller's thread: mean {r['call_mean_us']:.0f} us, "
              f"worst {r['call_max_us']:.0f} us, {r['behind_steps']} steps kept without "
              "their cells (writer_behind)")  # fmt: skip
    tl = results.get("torchlens")
    if tl:
        print(f"\ntorchlens commit cost: first {tl['first_commits_ms']:.1f} ms, last "
              f"{tl['last_commits_ms']:.1f} ms (index.json rewritten whole per commit)")  # fmt: skip
    rd = read_stepscope(root / "ss", a)
    print(f"\nstepscope read: {rd['rows']} observation rows in {rd['full']:.3f} s "
          f"({rd['rows'] / rd['full'] / 1e6:.2f} M rows/s); {rd['hist_rows']} histogram rows in "
          f"{rd['full_hist']:.3f} s; filtered (1 site, 1 stream, 50 steps) {rd['filtered'] * 1e3:.1f} ms; "
          f"verify {rd['verify']:.3f} s ok={rd['ok']}")  # fmt: skip
    if "tensorboard" in results:
        tb = read_tensorboard(root / "tb")
        tb_rows = results["tensorboard"]["rows"]
        print(f"tensorboard read: {tb_rows} rows in {tb['full']:.3f} s "
              f"({tb_rows / tb['full'] / 1e6:.3f} M rows/s); one tag {tb['filtered'] * 1e3:.0f} ms")  # fmt: skip
        print(f"read rate ratio (stepscope / tensorboard): "
              f"{(rd['rows'] / rd['full']) / (tb_rows / tb['full']):.0f}x")  # fmt: skip
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    json.dumps(results)  # results stay JSON-safe for callers that import main()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

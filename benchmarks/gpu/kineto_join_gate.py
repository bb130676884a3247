"""GPU acceptance gate for the Kineto device-time join (needs CUDA; skips cleanly without it).

Run from the repository root with only torch installed::

    PYTHONPATH=src python benchmarks/gpu/kineto_join_gate.py

For a small CNN and a transformer block (both built from ``torch.nn`` only) it profiles a
forward pass (``stepscope.kernel_profile``) and a forward+backward step (``stepscope.session``),
each through three event paths: in memory, the disclosed chrome-trace fallback, and a saved
trace re-read with ``stepscope.profile.load_trace``. It fails (exit 1) unless every case joins
at least 95% of its device time to ops, and prints the numbers. Without CUDA it prints a skip
notice and exits 0.
"""

from __future__ import annotations

import sys
import tempfile
import time
import traceback
from pathlib import Path

THRESHOLD = 0.95


def build_models(torch):
    nn = torch.nn
    cnn = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    block = nn.TransformerEncoderLayer(
        d_model=256, nhead=8, dim_feedforward=1024, batch_first=True, dropout=0.1
    )
    return [
        ("cnn", cnn, lambda: torch.randn(32, 3, 32, 32, device="cuda")),
        ("transformer_block", block, lambda: torch.randn(16, 128, 256, device="cuda")),
    ]


def describe(label, result):
    acc = result.join.accounting
    frac = acc.joined_fraction
    cc = result.join.cross_check
    print(
        f"  {label:<28} source={result.source:<22} availability={result.availability.value:<8}"
        f" device_events={acc.device_event_count:<5} sum={acc.device_time_sum_ns / 1e3:9.1f}us"
        f" busy={acc.device_busy_ns / 1e3:9.1f}us joined={'n/a' if frac is None else f'{frac:.2%}'}"
        f" (a) {acc.part_a_unique_ns / 1e3:.1f}+{acc.part_a_ambiguous_ns / 1e3:.1f}us"
        f" (b) {acc.part_b_internal_ns / 1e3:.1f}us residual={acc.residual_ns or 'none'}"
        f" xcheck agree/disagree/na={cc.agree}/{cc.disagree}/{cc.unavailable}"
    )
    if acc.residual_ns:  # show what did not join, to make a failure actionable
        events = result.join.events
        shown = 0
        for a in result.join.device:
            if a.owner is None and a.group is None and shown < 5:
                launch = events[a.launch].name if a.launch is not None else None
                print(f"      unjoined [{a.status.value}] {events[a.event].name[:70]} "
                      f"corr={events[a.event].correlation} launch={launch}")  # fmt: skip
                shown += 1
    return frac


def run_case(ss, torch, name, model, make_input, workdir):
    """Returns a list of (label, joined_fraction) for one model."""
    model = model.cuda()
    x = make_input()
    out = []
    fwd = ss.kernel_profile(model, x, warmup=2)
    out.append((f"{name}/forward in-memory", describe(f"{name}/forward", fwd)))
    rows = fwd.hot_path(by="device_time", top=3)
    for row in rows:
        print(f"      top: {row.key[:60]:<60} {row.device_self_ns / 1e3:9.1f}us {row.share:6.1%}")
    fb = ss.kernel_profile(model, x, warmup=0, force_fallback=True)
    out.append((f"{name}/forward fallback", describe(f"{name}/forward fallback", fb)))

    def train_step():
        model.zero_grad(set_to_none=True)
        with ss.region("train_step"):
            loss = model(x).float().pow(2).mean()
            loss.backward()
        torch.cuda.synchronize()

    train_step()
    with ss.session() as s:
        train_step()
    out.append((f"{name}/train in-memory", describe(f"{name}/train step", s.result)))
    trace, _ = s.result.export_chrome_trace(Path(workdir) / f"{name}.json")
    loaded = ss.profile.load_trace(trace)
    out.append((f"{name}/train saved trace", describe(f"{name}/train saved trace", loaded)))
    return out


def main() -> int:
    started = time.perf_counter()
    import torch

    print(f"kineto_join_gate: torch {torch.__version__}, python {sys.version.split()[0]}")
    if not torch.cuda.is_available():
        print("SKIP: CUDA is not available on this machine; the gate needs a GPU (exit 0).")
        return 0
    import stepscope as ss

    print(f"device: {torch.cuda.get_device_name(0)}; threshold {THRESHOLD:.0%} of device time")
    torch.manual_seed(0)
    results = []
    with tempfile.TemporaryDirectory(prefix="kineto-gate-") as workdir:
        for name, model, make_input in build_models(torch):
            try:
                results += run_case(ss, torch, name, model, make_input, workdir)
            except Exception:  # report, then fail the gate
                traceback.print_exc()
                results.append((f"{name} (raised)", None))
    failed = [(label, f) for label, f in results if f is None or f < THRESHOLD]
    print("summary:")
    for label, frac in results:
        shown = "n/a" if frac is None else f"{frac:.2%}"
        print(f"  {'PASS' if (label, frac) not in failed else 'FAIL'} {label:<40} joined {shown}")
    print(f"elapsed {time.perf_counter() - started:.1f}s")
    if failed:
        print(f"GATE FAILED: {len(failed)} of {len(results)} cases below {THRESHOLD:.0%}")
        return 1
    print(f"GATE PASSED: all {len(results)} cases join >= {THRESHOLD:.0%} of device time")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training-step overhead of stepscope beside its peers, in total time, in one process.

Run:  .venv/bin/python benchmarks/overhead.py [--steps 30] [--warmup 22] [--threads 1]
                                              [--models resnet gpt ciresan mlp4] [--no-peers]
                                              [--activation-every 2 5] [--no-noise-arm]

Models, built here from configs (no downloads): a ResNet-18-like CNN (BasicBlocks 2-2-2-2, base
width 16, 32x32 inputs, batch 8), a GPT-like decoder (4 pre-norm causal layers, d=128, 4 heads,
seq 64, vocab 512, batch 8), the Ciresan MLP (784-2500-2000-1500-1000-500-10, batch 64) and the
784-1500-1000-500-10 MLP (batch 64) for the "four spines every step" goal. SGD momentum 0.9, CPU.

Arms, each on its own same-seed model copy, taking turns step by step (machine drift hits all
alike): the unobserved control; a second unobserved copy, whose ratio is the run's noise floor
(two identical copies differ by this much; on a shared machine 1-3 points); stepscope at its
default cadence; stepscope ``cadence="auto"``
(its prediction printed beside its measurement); ``wandb.watch(log="all", log_freq=10)``
offline; a hand-written ``SummaryWriter.add_histogram`` of every parameter and gradient every 10
steps; torchlens 2.36 defaults (where installed). On the MLPs: stepscope with the four streams'
spines every step, and (Ciresan) every stream with histograms every 10 steps against the floor
(one ``torch.sum`` pass over exactly the tensors a fully logged step observes).

Statistic: **total time** of the timed steps (a multiple of 10, so every window holds a whole
cadence period, parameter streams and histograms included) relative to the control's; the
median step ratio is printed beside it only to show what a median hides. The CPU-time ratio
(``time.thread_time`` of the training thread over the same steps) is immune to other processes
on a shared machine but blind to time spent waiting for the disk (a commit's fsyncs): read the
total time on a quiet machine, the CPU time where the machine is shared. ``cadence="auto"``
decides during the warm-up (its default 20 steps), so ``--warmup`` must exceed 20.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from stepscope.collect import ALL_STREAMS, Cadence, HistoryCollector, WatchSettings
from stepscope.demo import ciresan_mlp
from stepscope.stats import backend_info

# ------------------------------------------------------------------------------------ models


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.short(x))


def resnet_like(width: int = 16, classes: int = 10) -> nn.Module:
    """ResNet-18 layout (2-2-2-2 BasicBlocks) at a given base width."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 3, 1, 1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
    ]
    cin = width
    for k, mult in enumerate((1, 2, 4, 8)):
        for j in range(2):
            layers.append(BasicBlock(cin, width * mult, 2 if (j == 0 and k > 0) else 1))
            cin = width * mult
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class GPTLike(nn.Module):
    """A GPT-like decoder: token + position embeddings, pre-norm causal blocks, tied-free head."""

    def __init__(self, vocab: int = 512, d: int = 128, heads: int = 4, layers: int = 4, seq: int = 64):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            h = block(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def mlp4() -> nn.Module:
    return nn.Sequential(
        nn.Linear(784, 1500), nn.ReLU(), nn.Linear(1500, 1000), nn.ReLU(),
        nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10),
    )  # fmt: skip


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], tuple]]] = {
    "resnet": (
        resnet_like,
        lambda g: (torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)),
    ),
    "gpt": (
        GPTLike,
        lambda g: (
            torch.randint(0, 512, (8, 64), generator=g),
            torch.randint(0, 512, (8, 64), generator=g),
        ),
    ),
    "ciresan": (
        ciresan_mlp,
        lambda g: (torch.rand(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)),
    ),
    "mlp4": (
        mlp4,
        lambda g: (torch.rand(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)),
    ),
}

# -------------------------------------------------------------------------------------- arms


class Arm:
    """One contender: a model copy, its optimizer, and how to run one step with it."""

    def __init__(self, name: str, make: Callable[[], nn.Module]) -> None:
        torch.manual_seed(0)
        self.name = name
        self.model = make()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.times: list[float] = []
        self.cpu: list[float] = []  # CPU seconds of this thread (immune to other processes)
        self.telemetry: list[float] = []
        self.step_fn: Callable[[torch.Tensor, torch.Tensor, int], None] = self.plain
        self.close: Callable[[], None] = lambda: None
        self.collector: HistoryCollector | None = None

    def plain(self, x: torch.Tensor, y: torch.Tensor, step: int) -> None:
        loss = loss_fn(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def timed(self, x: torch.Tensor, y: torch.Tensor, step: int) -> None:
        c0, t0 = time.thread_time(), time.perf_counter()
        self.step_fn(x, y, step)
        self.times.append(time.perf_counter() - t0)
        self.cpu.append(time.thread_time() - c0)


def stepscope_arm(name: str, make, tmp: str, streams=None, cadence=None) -> Arm:
    arm = Arm(name, make)
    settings = WatchSettings(output_dir=tempfile.mkdtemp(dir=tmp))
    kwargs = {} if streams is None else {"streams": streams}
    c = HistoryCollector(arm.model, cadence=cadence, settings=settings, **kwargs)

    def step(x, y, i):
        before = c.telemetry_seconds
        with c.step(arm.opt, examples=len(y)):
            arm.plain(x, y, i)
        arm.telemetry.append(c.telemetry_seconds - before)

    arm.step_fn, arm.close, arm.collector = step, c.close, c
    return arm


def wandb_arm(make, tmp: str) -> Arm | str:
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb
    except Exception as exc:
        return f"wandb unavailable ({type(exc).__name__})"
    arm = Arm('wandb.watch(log="all", log_freq=10)', make)
    run = wandb.init(project="stepscope-bench", dir=tmp, mode="offline")
    wandb.watch(arm.model, log="all", log_freq=10)  # wandb.watch logs through the global run

    def step(x, y, i):
        arm.plain(x, y, i)
        run.log({"step": i})

    def close():
        wandb.unwatch(arm.model)
        run.finish()

    arm.step_fn, arm.close = step, close
    return arm


def add_histogram_arm(make, tmp: str) -> Arm | str:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception as exc:
        return f"tensorboard unavailable ({type(exc).__name__})"
    arm = Arm("add_histogram every 10 steps (hand-written)", make)
    writer = SummaryWriter(os.path.join(tmp, "tb"))

    def step(x, y, i):
        arm.plain(x, y, i)
        if i % 10 == 0:
            for name, p in arm.model.named_parameters():
                writer.add_histogram(f"param/{name}", p.detach(), i)
                if p.grad is not None:
                    writer.add_histogram(f"grad/{name}", p.grad, i)

    arm.step_fn, arm.close = step, writer.close
    return arm


def torchlens_arm(make, tmp: str, x: torch.Tensor) -> Arm | str:
    try:
        import torchlens
        from torchlens.observability import HistoryCollector as TLCollector
        from torchlens.observability import WatchSettings as TLSettings
    except Exception as exc:
        return f"torchlens unavailable ({type(exc).__name__})"
    arm = Arm(f"torchlens {torchlens.__version__} defaults", make)
    c = TLCollector(arm.model, settings=TLSettings(output_dir=tempfile.mkdtemp(dir=tmp)))
    with torch.no_grad():
        c.discover(x)
    c.attach(arm.opt)

    def step(x, y, i):
        with c.step(i):
            arm.plain(x, y, i)

    arm.step_fn, arm.close = step, c.detach
    return arm


# ------------------------------------------------------------------------------------ running


def floor_seconds(
    model: nn.Module, x, y, sample: int, activation_grads: bool = True
) -> tuple[float, int]:
    """One torch.sum pass over exactly the tensors a fully logged step observes (5 streams;
    4 without ``activation_grads``: activations, parameters, gradients, update samples)."""
    captured: list[torch.Tensor] = []
    leaves = [m for n, m in model.named_modules() if n and next(m.children(), None) is None]

    def keep(m, i, o):
        captured.append(o.detach())
        if activation_grads and o.requires_grad:
            o.register_hook(lambda g: captured.append(g.detach()))

    handles = [m.register_forward_hook(keep) for m in leaves]
    try:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
    finally:
        for h in handles:
            h.remove()
    params = [p.detach() for p in model.parameters()]
    grads = [p.grad.detach() for p in model.parameters()]
    updates = [p.reshape(-1)[: min(p.numel(), sample)].clone() for p in params]
    tensors = captured + params + grads + updates
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        for t in tensors:
            torch.sum(t)
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return statistics.median(times), sum(t.numel() for t in tensors)


def run_model(key: str, args, tmp: str) -> None:
    make, data_fn = MODELS[key]
    g = torch.Generator().manual_seed(0)
    data = [data_fn(g) for _ in range(4)]
    arms: list[Arm] = [Arm("control (unobserved)", make)]
    if not args.no_noise_arm:  # a second unobserved copy: the noise floor of this run
        arms.append(Arm("control, second copy (noise floor)", make))
    notes: list[str] = []
    four = ("activation", "gradient", "parameter", "update")
    if key != "mlp4":
        arms.append(stepscope_arm("stepscope default cadence", make, tmp))
        arms.append(stepscope_arm('stepscope cadence="auto"', make, tmp, cadence="auto"))
        for k in args.activation_every:  # the case for a sparser default (not adopted)
            slow = {s: Cadence(k, 100) for s in ("activation", "activation_grad")}
            arms.append(
                stepscope_arm(f"stepscope default, activation spines every {k}", make, tmp, None, slow)
            )
        if not args.no_peers:
            for made in (
                wandb_arm(make, tmp),
                add_histogram_arm(make, tmp),
                torchlens_arm(make, tmp, data[0][0]),
            ):
                (arms.append if isinstance(made, Arm) else notes.append)(made)
    four_arm = None
    if key in ("mlp4", "ciresan"):
        four_arm = stepscope_arm("stepscope 4 spines every step", make, tmp, four, Cadence(1, None))
        arms.append(four_arm)
    full = None
    if key == "ciresan":
        full = stepscope_arm("stepscope 5 streams, spine 1, hist 10", make, tmp, ALL_STREAMS, Cadence(1, 10))
        arms.append(full)
    for i in range(args.warmup + args.steps):
        x, y = data[i % len(data)]
        for arm in arms if i % 2 == 0 else arms[::-1]:
            (arm.step_fn if i < args.warmup else arm.timed)(x, y, i)
    for arm in arms:
        arm.close()
    control = arms[0]
    total_c, med_c = sum(control.times), statistics.median(control.times)
    print(f"\n### {key}: control step {med_c * 1e3:.1f} ms (median), {len(control.times)} timed steps")
    cpu_c = sum(control.cpu)
    print("| arm | total time ratio | median step ratio | CPU-time ratio | predicted |")
    print("|---|---:|---:|---:|---:|")
    for arm in arms:
        pred = ""
        if arm.collector is not None and arm.collector.cadence_decision is not None:
            exp = arm.collector.cadence_decision.get("expected_overhead")
            pred = "" if exp is None else f"{1 + exp:.3f}"
        print(
            f"| {arm.name} | {sum(arm.times) / total_c:.3f} "
            f"| {statistics.median(arm.times) / med_c:.3f} | {sum(arm.cpu) / cpu_c:.3f} | {pred} |"
        )
    for note in notes:
        print(f"| {note} | - | - | - | |")
    for arm in arms:
        d = arm.collector.cadence_decision if arm.collector is not None else None
        if d:
            spine = {s: c["spine"] for s, c in d["cadences"].items()}
            print(
                f"auto decision: rule {d['rule']}, spine cadences {spine}, training "
                f"{d['training_seconds_median'] * 1e3:.1f} ms, fixed {d['fixed_seconds'] * 1e3:.2f} ms, "
                f"streams { {s: round(v * 1e3, 2) for s, v in d['stream_seconds_median'].items()} } ms"
            )
    if four_arm is not None:  # what any tool that reads these tensors once must pay
        floor4, n4 = floor_seconds(control.model, *data[0], 4096, activation_grads=False)
        extra = (sum(four_arm.times) - total_c) / len(four_arm.times)
        print(
            f"\nfour spines' floor: one torch.sum pass over the {n4:,} elements they read = "
            f"{floor4 * 1e3:.2f} ms = {floor4 / med_c:.3f} of a control step (so a 4-spine arm "
            f"costs at least {1 + floor4 / med_c:.3f}x); stepscope's arm adds {extra * 1e3:.2f} ms "
            f"= {extra / floor4:.2f}x that floor"
        )
    if full is not None:
        floor, n_el = floor_seconds(control.model, *data[0], 4096)
        tel = full.telemetry[args.warmup :]
        first = args.warmup
        hist = [t for k, t in enumerate(tel) if (first + k) % 10 == 0]
        spine = [t for k, t in enumerate(tel) if (first + k) % 10 != 0]
        print(f"\nfloor: one torch.sum pass over the {n_el:,} elements of a fully logged step: {floor * 1e3:.2f} ms")
        if spine:
            print(f"spine-only logged step: {statistics.median(spine) / floor:.2f}x the floor (goal <= 2x)")
        if hist:
            print(f"logged step with histograms: {statistics.median(hist) / floor:.2f}x the floor (goal <= 4x)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per arm (a multiple of 10)")
    ap.add_argument("--warmup", type=int, default=22, help="untimed steps (> auto's 20-step warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--no-peers", action="store_true", help="skip wandb, add_histogram, torchlens")
    ap.add_argument(
        "--no-noise-arm", action="store_true", help="skip the second unobserved copy (noise floor)"
    )
    ap.add_argument(
        "--activation-every",
        type=int,
        nargs="*",
        default=[],
        help="extra arms: the default cadence with activation spines every K steps",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.steps = max(10, math.ceil(args.steps / 10) * 10)
    print(f"command: python {' '.join(sys.argv)}")
    info = backend_info()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, kernel {info['cpu']} ({info['source']}, {info['isa']})")
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            run_model(key, args, tmp)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

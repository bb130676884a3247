"""Cost of the dense probe next to the alternatives, as ratios to one forward+backward.

Run (from the repository root)::

    .venv/bin/python benchmarks/probe.py                 # Ciresan MLP, 128 examples, 1 thread
    .venv/bin/python benchmarks/probe.py --widths 784,1000,500,10 --repeats 3
    .venv/bin/python benchmarks/probe.py --transformer 128,512   # GPT-style block, 16 sequences
    .venv/bin/python benchmarks/probe.py --vocab-head 50257      # peak RSS, 50,257-class LM head
    .venv/bin/python benchmarks/probe.py --llama 64,128          # LLaMA block vs Opacus

Every method sees the same model weights and the same 128 examples, in the same process, with
interleaved repeats; the table reports the median seconds and the ratio to the baseline, one
forward+backward of the probe batch (mean cross-entropy, ``.backward()``):

- ``stepscope DenseProbe.measure``: every probe quantity (per-example weight/bias moments, zero
  fractions, parameter norms, loss/accuracy/confusion) in one forward and one backward.
- ``torch.func vmap``: per-example gradients by ``vmap(grad)`` in chunks, then the same moments.
- ``BackPACK BatchL2Grad`` / ``Variance``: one extended backward on a separate ``extend()`` copy.
- ``Cockpit economy``: one training step with Cockpit's economy configuration, against one plain
  training step; skipped with a printed reason if Cockpit does not import or would need more
  memory than ``--cockpit-max-gb`` for its per-example gradients.

``--transformer T1,T2``: a GPT-style decoder (token + position embeddings, one pre-LayerNorm
block with fused ``qkv`` and projection Linears, a 4x MLP, final LayerNorm, LM head; next-token
loss over ``T`` positions) instead of the MLP, at each sequence length; BackPACK is reported as
not applicable (it has no rule for attention's matmuls / LayerNorm in a custom module).

``--vocab-head C``: peak resident memory (``ru_maxrss``, each in a fresh subprocess) of one
forward+backward and of one ``DenseProbe.measure`` of a tied-embedding LM with a ``C``-class head,
with the size of one ``C x C`` int64 confusion matrix (what the probe no longer allocates) for scale.

``--llama T1,T2``: one HF ``LlamaForCausalLM`` layer (RMSNorm, rotary grouped-query attention,
SwiGLU, untied head) from a tiny config; the probe beside Opacus ``GradSampleModule`` (one
backward materialising every per-sample gradient) and Opacus ghost clipping
(``GradSampleModuleFastGradientClipping``: a backward for the per-sample norms, then the clipped
backward, as ``DPLossFastGradientClipping.backward`` runs them). The probe's one-time broadcast
test (:mod:`stepscope.probe.calls`) is run before timing.

Timings are wall-clock medians on a shared CPU: compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from stepscope.probe import DenseProbe


def ciresan(widths: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Block(nn.Module):
    """Pre-LayerNorm decoder block: fused qkv Linear, causal attention, projection, 4x MLP."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        q, k, v = (
            z.reshape(n, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv(self.ln_1(x)).chunk(3, -1)
        )
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(n, t, d))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d: int, positions: int, heads: int = 4, tied: bool = False):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(positions, d)
        self.block, self.ln_f = Block(d, heads), nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device).unsqueeze(0)
        return self.lm_head(self.ln_f(self.block(self.wte(idx) + self.wpe(pos))))


def lm_loss(logits: torch.Tensor, idx: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1), reduction=reduction
    )


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def vmap_moments(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk: int) -> None:
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None], reduction="sum")

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))
    sq = {k: [] for k in params}
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for s in range(0, x.shape[0], chunk):
        g = per_example(params, x[s : s + chunk], y[s : s + chunk])
        for k, v in g.items():
            sq[k].append(v.flatten(1).square().sum(1))
            total[k] += v.sum(0)
    for k in params:  # the same moments the probe reports
        fisher = torch.cat(sq[k]).mean()
        _ = fisher - (total[k] / x.shape[0]).square().sum()


def vmap_lm_moments(model: nn.Module, idx: torch.Tensor, chunk: int) -> None:
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi):
        return lm_loss(functional_call(model, p, (xi[None],)), xi[None], "sum")

    per_example = vmap(grad(loss), in_dims=(None, 0))
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    sq = {k: [] for k in params}
    for s in range(0, idx.shape[0], chunk):
        for k, v in per_example(params, idx[s : s + chunk]).items():
            sq[k].append(v.flatten(1).square().sum(1))
            total[k] += v.sum(0)
    for k in params:
        _ = torch.cat(sq[k]).mean() - (total[k] / idx.shape[0]).square().sum()


def run_table(methods: dict[str, tuple[Callable[[], object], int]]) -> dict[str, list[float]]:
    """Warm up, then interleave repeats; seconds per method."""
    times: dict[str, list[float]] = {k: [] for k in methods}
    for fn, _ in methods.values():
        fn()
    for r in range(max(reps for _, reps in methods.values())):
        for name, (fn, reps) in methods.items():
            if r < reps:
                times[name].append(timed(fn))
    return times


def transformer_main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    for t in (int(v) for v in args.transformer.split(",")):
        torch.manual_seed(0)
        model = TinyLM(vocab=args.lm_vocab, d=args.lm_width, positions=t).eval()
        n_params = sum(p.numel() for p in model.parameters())
        idx = torch.randint(
            0, args.lm_vocab, (args.lm_batch, t), generator=torch.Generator().manual_seed(1)
        )
        probe = DenseProbe(idx, idx, size=args.lm_batch, seed=0, next_token=True)

        def fwd_bwd(model: nn.Module = model, idx: torch.Tensor = idx) -> None:
            model.zero_grad(set_to_none=True)
            lm_loss(model(idx), idx).backward()

        methods = {
            "forward+backward (baseline)": (fwd_bwd, args.repeats),
            "stepscope DenseProbe.measure (all layers, all moments)": (
                lambda probe=probe, model=model: probe.measure(
                    model, step=0, examples_seen=0, epoch=0, resnapshot=False
                ),
                args.repeats,
            ),
        }
        if "vmap" not in set(args.skip.split(",")):
            methods[f"torch.func vmap per-example grads (chunk {args.vmap_chunk})"] = (
                lambda model=model, idx=idx: vmap_lm_moments(model, idx, args.vmap_chunk),
                args.slow_repeats,
            )
        times = run_table(methods)
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med["forward+backward (baseline)"]
        print(
            f"\nGPT-style block, T={t}, {args.lm_batch} sequences, d={args.lm_width}, vocab "
            f"{args.lm_vocab} ({n_params:,} parameters), torch {torch.__version__}, "
            f"threads {args.threads}"
        )
        print(f"{'method':58s} {'median s':>10s} {'x fwd+bwd':>10s} {'repeats':>8s}")
        for name in methods:
            print(f"{name:58s} {med[name]:10.4f} {med[name] / base:10.2f} {len(times[name]):8d}")
        print(
            f"{'BackPACK BatchL2Grad / Variance':58s} {'n/a':>10s}  (no rule for attention "
            "matmuls or LayerNorm in a custom module)"
        )
    return 0


class LlamaLogits(nn.Module):
    """HF ``LlamaForCausalLM`` as ``idx -> logits`` (what the probe and Opacus both call)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx).logits


def llama_block(vocab: int, d: int) -> nn.Module:
    """One LLaMA block from a tiny config: RMSNorm, rotary GQA attention, SwiGLU MLP, LM head."""
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=int(8 * d / 3),
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    return LlamaLogits(transformers.LlamaForCausalLM(cfg))


def per_token_losses(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``(n,)`` per-sequence summed next-token losses."""
    n = idx.shape[0]
    return lm_loss(logits, idx, "none").reshape(n, -1).sum(1)


def llama_main(args: argparse.Namespace) -> int:
    """Probe vs one forward+backward vs Opacus per-sample and ghost clipping on a LLaMA block."""
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping

    torch.set_num_threads(args.threads)
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    warnings.filterwarnings("ignore")
    for t in (int(v) for v in args.llama.split(",")):
        torch.manual_seed(0)
        model = llama_block(args.lm_vocab, args.lm_width).eval()
        n_params = sum(p.numel() for p in model.parameters())
        idx = torch.randint(
            0, args.lm_vocab, (args.lm_batch, t), generator=torch.Generator().manual_seed(1)
        )
        probe = DenseProbe(idx, idx, size=args.lm_batch, seed=0, next_token=True)
        probe.measure(model, step=0, examples_seen=0, epoch=0, resnapshot=False)  # layout test
        per_sample = GradSampleModule(
            copy.deepcopy(model), batch_first=True, loss_reduction="sum", strict=False
        ).train()  # Opacus hooks record in train mode only (no dropout in this config)
        ghost = GradSampleModuleFastGradientClipping(
            copy.deepcopy(model),
            batch_first=True,
            loss_reduction="sum",
            strict=False,
            max_grad_norm=1.0,
            use_ghost_clipping=True,
        ).train()

        def fwd_bwd(model: nn.Module = model, idx: torch.Tensor = idx) -> None:
            model.zero_grad(set_to_none=True)
            lm_loss(model(idx), idx, "sum").backward()

        def opacus_per_sample(m: nn.Module = per_sample, idx: torch.Tensor = idx) -> None:
            m.zero_grad(set_to_none=True)
            lm_loss(m(idx), idx, "sum").backward()  # grad_sample of every parameter
            for p in m.parameters():
                p.grad_sample = None

        def opacus_ghost(m: nn.Module = ghost, idx: torch.Tensor = idx) -> None:
            # what DPLossFastGradientClipping.backward does: norms, then the clipped backward
            m.zero_grad(set_to_none=True)
            losses = per_token_losses(m(idx), idx)
            losses.sum().backward(retain_graph=True)
            m.zero_grad(set_to_none=True)
            coeff = m.get_clipping_coef()
            m.disable_hooks()
            (coeff * losses).sum().backward()
            m.enable_hooks()

        methods = {
            "forward+backward (baseline)": (fwd_bwd, args.repeats),
            "stepscope DenseProbe.measure (all 12 blocks, all moments)": (
                lambda probe=probe, model=model: probe.measure(
                    model, step=0, examples_seen=0, epoch=0, resnapshot=False
                ),
                args.repeats,
            ),
            "Opacus GradSampleModule (per-sample grads)": (opacus_per_sample, args.repeats),
            "Opacus ghost clipping (norms + clipped backward)": (opacus_ghost, args.repeats),
        }
        times = run_table(methods)
        med = {k: statistics.median(v) for k, v in times.items()}
        base = med["forward+backward (baseline)"]
        print(
            f"\nLLaMA block (HF LlamaForCausalLM, 1 layer, GQA 4/2 heads, SwiGLU), T={t}, "
            f"{args.lm_batch} sequences, d={args.lm_width}, vocab {args.lm_vocab} "
            f"({n_params:,} parameters), torch {torch.__version__}, threads {args.threads}"
        )
        print(f"{'method':58s} {'median s':>10s} {'x fwd+bwd':>10s} {'repeats':>8s}")
        for name in methods:
            print(f"{name:58s} {med[name]:10.4f} {med[name] / base:10.2f} {len(times[name]):8d}")
    return 0


def rss_child(what: str, vocab: int, batch: int, t: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyLM(vocab=vocab, d=64, positions=t, tied=True).eval()
    idx = torch.randint(0, vocab, (batch, t), generator=torch.Generator().manual_seed(1))
    if what == "probe":
        rec = DenseProbe(idx, idx, size=batch, seed=0, next_token=True).measure(
            model, step=0, examples_seen=0, epoch=0
        )
        assert rec.model.confusion_mode == "bounded"
    elif what == "fwd_bwd":
        lm_loss(model(idx), idx).backward()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux: KiB


def vocab_main(args: argparse.Namespace) -> int:
    c, batch, t = args.vocab_head, args.vocab_batch, args.vocab_seq
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    peak = {}
    for what in ("model_only", "fwd_bwd", "probe"):
        out = subprocess.run(
            [sys.executable, __file__, "--rss-child", f"{what},{c},{batch},{t}"],
            capture_output=True,
            text=True,
            check=True,
        )
        peak[what] = int(out.stdout.strip().splitlines()[-1])
    logits = batch * t * c * 4
    print(
        f"tied-embedding LM, {c:,}-class head, d=64, {batch} sequences x T={t} "
        f"(logits {logits / 2**20:.0f} MiB float32), torch {torch.__version__}"
    )
    for what, label in (
        ("model_only", "build model + data (no forward)"),
        ("fwd_bwd", "one forward+backward"),
        ("probe", "one DenseProbe.measure (bounded confusion)"),
    ):
        extra = peak[what] - peak["model_only"]
        print(
            f"{label:48s} peak RSS {peak[what] / 2**20:8.0f} MiB  (+{extra / 2**20:6.0f} MiB, "
            f"{extra / logits:5.1f}x logits)"
        )
    print(f"a dense C x C int64 confusion matrix would be {c * c * 8 / 2**30:.1f} GiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="784,2500,2000,1500,1000,500,10")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slow-repeats", type=int, default=2, help="repeats for vmap and Cockpit")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vmap-chunk", type=int, default=16)
    ap.add_argument("--cockpit-max-gb", type=float, default=6.0)
    ap.add_argument("--skip", default="", help="comma list of: vmap,backpack,cockpit")
    ap.add_argument("--transformer", default="", help="sequence lengths, e.g. 128,512")
    ap.add_argument("--llama", default="", help="LLaMA block vs Opacus at sequence lengths")
    ap.add_argument("--lm-batch", type=int, default=16)
    ap.add_argument("--lm-width", type=int, default=128)
    ap.add_argument("--lm-vocab", type=int, default=512)
    ap.add_argument("--vocab-head", type=int, default=0, help="peak RSS with a C-class LM head")
    ap.add_argument("--vocab-batch", type=int, default=8)
    ap.add_argument("--vocab-seq", type=int, default=64)
    ap.add_argument("--rss-child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rss_child:
        what, c, batch, t = args.rss_child.split(",")
        rss_child(what, int(c), int(batch), int(t))
        return 0
    if args.transformer:
        return transformer_main(args)
    if args.llama:
        return llama_main(args)
    if args.vocab_head:
        return vocab_main(args)
    skip = set(filter(None, args.skip.split(",")))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    widths = [int(w) for w in args.widths.split(",")]
    model = ciresan(widths)
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (args.batch, widths[0]), generator=g).float()  # pixel-like 0..255
    x = x / 255.0
    y = torch.randint(0, widths[-1], (args.batch,), generator=g)
    probe = DenseProbe(x, y, size=args.batch, seed=0, input_normalization="x/255")

    def fwd_bwd() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()

    methods: dict[str, tuple[Callable[[], object], int]] = {
        "forward+backward (baseline)": (fwd_bwd, args.repeats),
        "stepscope DenseProbe.measure (all moments)": (
            lambda: probe.measure(model, step=0, examples_seen=0, epoch=0, resnapshot=False),
            args.repeats,
        ),
    }
    notes: list[str] = []
    if "vmap" not in skip:
        methods[f"torch.func vmap per-example grads (chunk {args.vmap_chunk})"] = (
            lambda: vmap_moments(model, x, y, args.vmap_chunk),
            args.slow_repeats,
        )
    if "backpack" not in skip:
        try:
            from backpack import backpack, extend
            from backpack.extensions import BatchL2Grad, Variance

            bp_model = extend(copy.deepcopy(model))
            bp_loss = extend(nn.CrossEntropyLoss())

            def run_bp(ext: object) -> Callable[[], None]:
                def fn() -> None:
                    bp_model.zero_grad(set_to_none=True)
                    with backpack(ext):
                        bp_loss(bp_model(x), y).backward()

                return fn

            methods["BackPACK BatchL2Grad"] = (run_bp(BatchL2Grad()), args.repeats)
            methods["BackPACK Variance"] = (run_bp(Variance()), args.repeats)
        except Exception as exc:  # report, do not hide
            notes.append(f"BackPACK skipped: {type(exc).__name__}: {exc}")
    cockpit_rows = cockpit_runs(model, x, y, args, notes) if "cockpit" not in skip else {}
    methods.update(cockpit_rows)

    times = run_table(methods)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["forward+backward (baseline)"]
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(
        f"model: Linear {widths} ReLU between ({n_params:,} parameters), batch {args.batch}, "
        f"torch {torch.__version__}, threads {args.threads}"
    )
    print(f"{'method':58s} {'median s':>10s} {'x fwd+bwd':>10s} {'repeats':>8s}")
    for name in methods:
        ratio = med[name] / base
        if name in cockpit_rows and "plain training step" not in name:
            plain = med.get("plain training step (Cockpit baseline)")
            extra = f"  ({med[name] / plain:.1f}x a plain step)" if plain else ""
        else:
            extra = ""
        print(f"{name:58s} {med[name]:10.4f} {ratio:10.2f} {len(times[name]):8d}{extra}")
    for note in notes:
        print("note:", note)
    return 0


def cockpit_runs(model, x, y, args, notes) -> dict[str, tuple[Callable[[], object], int]]:
    n_params = sum(p.numel() for p in model.parameters())
    need_gb = 2 * args.batch * n_params * 4 / 1e9  # per-example gradients plus one working copy
    if need_gb > args.cockpit_max_gb:
        notes.append(
            f"Cockpit economy skipped: its per-example gradients need ~{need_gb:.1f} GB "
            f"(> --cockpit-max-gb {args.cockpit_max_gb}); rerun with a larger limit or --widths"
        )
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from backpack import extend
            from cockpit import Cockpit
            from cockpit.utils.configuration import configuration
    except Exception as exc:
        notes.append(f"Cockpit skipped: {type(exc).__name__}: {exc}")
        return {}
    cp_model = extend(copy.deepcopy(model))
    cp_loss = extend(nn.CrossEntropyLoss())
    each = nn.CrossEntropyLoss(reduction="none")
    opt = torch.optim.SGD(cp_model.parameters(), lr=1e-3, momentum=0.9)
    plain_model = copy.deepcopy(model)
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=1e-3, momentum=0.9)
    cockpit = Cockpit(list(cp_model.parameters()), quantities=configuration("economy"))
    state = {"step": 0}

    def cockpit_step() -> None:
        opt.zero_grad()
        out = cp_model(x)
        loss, losses = cp_loss(out, y), each(out, y)
        info = {
            "batch_size": x.shape[0],
            "individual_losses": losses,
            "loss": loss,
            "optimizer": opt,
        }
        with cockpit(state["step"], info=info):
            loss.backward(create_graph=cockpit.create_graph(state["step"]))
        opt.step()
        state["step"] += 1

    def plain_step() -> None:
        plain_opt.zero_grad()
        F.cross_entropy(plain_model(x), y).backward()
        plain_opt.step()

    return {
        "plain training step (Cockpit baseline)": (plain_step, args.slow_repeats),
        "Cockpit economy training step": (cockpit_step, args.slow_repeats),
    }


if __name__ == "__main__":
    raise SystemExit(main())

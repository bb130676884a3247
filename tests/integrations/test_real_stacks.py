"""The real-stack matrix: gradient and update rows are what each optimizer consumed.

Tiny configs, 2-4 optimizer steps each, on CPU: transformers' LLaMA (foreach and fused AdamW,
``clip_grad_norm_``) and T5 (two micro-batches per step), LoRA (peft) on GPT-2 with
``AdamW(model.parameters())`` (frozen base weights), a mixture of experts with an expert no token
reaches, and the Hugging Face ``Trainer`` (accumulation, ``max_grad_norm``). Lightning's cases
(clipping, accumulation, manual optimization, GANs) are in ``test_lightning_optimizers.py``.

Every case compares each recorded gradient row with :class:`tests.collect.consumed.Consumed`
(the gradients the torch optimizer gathers inside its own ``step()``, in float64), checks that
exactly the parameters it stepped have observed update rows (the others: ``site_absent`` with
``not_stepped:grad_none``), and runs an unobserved twin that must agree bit for bit. What each
stream means per stack: ``docs/trainers.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

import stepscope as ss
from tests.collect.consumed import Consumed, assert_rows_are_consumed, update_presence
from tests.hf_models import tiny_model
from tests.integrations.integrations_testkit import optimizer_state_equal, state_equal

tf = pytest.importorskip("transformers")

STEPS = 3


def _tokens(step: int, micro: int, n: int = 2, t: int = 8, vocab: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + micro)
    return torch.randint(0, vocab, (n, t), generator=g)


def _explicit(
    tmp_path,
    make_model: Callable[[], nn.Module],
    make_opt: Callable[[nn.Module], torch.optim.Optimizer],
    loss_of: Callable[[nn.Module, int, int], torch.Tensor],
    *,
    micro: int = 1,
    clip: float | None = None,
    observe: bool = True,
):
    """``STEPS`` explicit steps of ``micro`` micro-batches each (clipped before the step)."""
    torch.manual_seed(0)
    model = make_model()
    model.train()
    opt = make_opt(model)
    oracle = Consumed(opt, model)
    settings = ss.WatchSettings(output_dir=str(tmp_path / "run"), durable=False, commit_steps=1)
    collector = ss.HistoryCollector(model, cadence=1, settings=settings) if observe else None
    try:
        for step in range(STEPS):
            ctx = collector.step(opt) if collector is not None else _null()
            with ctx:
                opt.zero_grad(set_to_none=True)
                for m in range(micro):
                    (loss_of(model, step, m) / micro).backward()
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
    finally:
        if collector is not None:
            collector.close()
    return model, opt, oracle


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _check(tmp_path, case: dict) -> tuple[nn.Module, list[dict]]:
    """The case's rows against the oracle, and bitwise purity against its twin."""
    seen, opt, oracle = _explicit(tmp_path / "seen", **case)
    twin, twin_opt, _ = _explicit(tmp_path / "twin", observe=False, **case)
    assert state_equal(seen.state_dict(), twin.state_dict())
    assert optimizer_state_equal(opt.state_dict(), twin_opt.state_dict())
    run = tmp_path / "seen" / "run"
    recorded = {s.name for s in ss.open_run(run).sites}
    names = [n for n, _ in seen.named_parameters() if n in recorded]
    assert len(oracle.steps) == STEPS and names
    assert_rows_are_consumed(run, oracle.steps, names)
    for step, consumed in enumerate(oracle.steps):
        rows = {n: v for n, v in update_presence(run, step).items() if n in names}
        observed = sorted(n for n, (p, _) in rows.items() if p == "observed")
        assert observed == sorted(n for n in consumed if n in names), step
        for n, (presence, notes) in rows.items():
            if n not in consumed:
                assert (presence, notes) == ("site_absent", ("not_stepped:grad_none",)), n
    return seen, oracle.steps


def _llama() -> nn.Module:
    return tiny_model("llama", width=32, vocab=64, num_key_value_heads=1)


def _lm_loss(model: nn.Module, step: int, m: int) -> torch.Tensor:
    ids = _tokens(step, m)
    return model(input_ids=ids, labels=ids).loss


@pytest.mark.parametrize("kind", ["foreach", "fused"])
def test_llama_with_clip_grad_norm_records_the_clipped_gradients(tmp_path, kind):
    case = dict(
        make_model=_llama,
        make_opt=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, **{kind: True}),
        loss_of=_lm_loss,
        clip=1e-2,
    )
    _, consumed = _check(tmp_path, case)
    norm = sum(v[2] for v in consumed[0].values()) ** 0.5
    assert norm == pytest.approx(1e-2, rel=1e-3)  # the optimizer consumed clipped gradients


def _t5() -> nn.Module:
    return tiny_model("t5", width=32, vocab=64, decoder_start_token_id=0, dropout_rate=0.1)


def _seq2seq_loss(model: nn.Module, step: int, m: int) -> torch.Tensor:
    return model(input_ids=_tokens(step, m), labels=_tokens(step, m + 10, t=6)).loss


def test_t5_with_two_micro_batches_records_the_accumulated_gradients(tmp_path):
    case = dict(
        make_model=_t5,
        make_opt=lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
        loss_of=_seq2seq_loss,
        micro=2,
    )
    _check(tmp_path, case)


def _lora_gpt2() -> nn.Module:
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True)
    return peft.get_peft_model(tiny_model("gpt2", width=32, vocab=64), lora)


def test_lora_base_weights_under_adamw_of_all_parameters_get_no_update(tmp_path):
    """``AdamW(model.parameters())`` holds the frozen base weights too; torch skips them."""
    case = dict(
        make_model=_lora_gpt2,
        make_opt=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
        loss_of=_lm_loss,
    )
    seen, consumed = _check(tmp_path, case)
    trainable = sorted(n for n, p in seen.named_parameters() if p.requires_grad)
    assert all("lora_" in n for n in trainable)
    assert all(sorted(c) == trainable for c in consumed)


class MoE(nn.Module):
    """Top-1 routing over four experts; the last expert's gate bias keeps every token away."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.gate = nn.Linear(16, 4)
        with torch.no_grad():
            self.gate.bias[3] = -1e4
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
        self.head = nn.Linear(16, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids).reshape(-1, 16)
        probs = self.gate(h).softmax(-1)
        top, choice = probs.max(-1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            mask = choice == e
            if mask.any():
                out[mask] = expert(h[mask]) * top[mask, None]
        return self.head(h + out)


def _moe_loss(model: nn.Module, step: int, m: int) -> torch.Tensor:
    ids = _tokens(step, m)
    return nn.functional.cross_entropy(model(ids), ids.reshape(-1))


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_an_expert_without_tokens_gets_no_update(tmp_path, name):
    make = {
        "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
    }[name]
    _, consumed = _check(tmp_path, dict(make_model=MoE, make_opt=make, loss_of=_moe_loss))
    assert all("experts.3.weight" not in c and "experts.0.weight" in c for c in consumed)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 8), generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf(root, observe: bool):
    from stepscope.integrations.transformers import StepscopeCallback

    torch.manual_seed(0)
    model = tiny_model("gpt2", width=32, layers=1, vocab=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    oracle = Consumed(opt, model)
    args = tf.TrainingArguments(
        output_dir=str(root),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_grad_norm=1e-2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    callbacks = [StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))]
    trainer = tf.Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(16),
        optimizers=(opt, None),
        callbacks=callbacks if observe else [],
    )
    trainer.train()
    return model, opt, oracle


def test_hf_trainer_accumulation_and_max_grad_norm_record_the_consumed_gradients(tmp_path):
    model, opt, oracle = _hf(tmp_path / "seen", True)
    twin, twin_opt, _ = _hf(tmp_path / "twin", False)
    assert state_equal(model.state_dict(), twin.state_dict())
    assert optimizer_state_equal(opt.state_dict(), twin_opt.state_dict())
    assert len(oracle.steps) == STEPS
    norm = sum(v[2] for v in oracle.steps[0].values()) ** 0.5
    assert norm == pytest.approx(1e-2, rel=1e-3)
    names = [n for n, _ in model.named_parameters()]
    assert_rows_are_consumed(tmp_path / "seen" / "stepscope", oracle.steps, names)

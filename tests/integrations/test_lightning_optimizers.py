"""Lightning: gradient and update rows are what each optimizer consumed.

Real ``lightning.pytorch.Trainer`` runs on CPU, 2-4 optimizer steps each: automatic
optimization with ``gradient_clip_val`` and accumulation, manual optimization with one
optimizer, and a GAN (two optimizers) stepping both in one batch or on alternate batches. The
oracle (:class:`tests.collect.consumed.Consumed`) reads, inside each torch optimizer's own
``step()``, the gradients it gathers (after Lightning's closure: backward, clipping), in
float64; each run is compared bit for bit with the same fit without stepscope.
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stepscope as ss
from stepscope.integrations.lightning import StepscopeCallback
from tests.collect.consumed import Consumed, assert_rows_are_consumed, update_presence
from tests.integrations.integrations_testkit import optimizer_state_equal, state_equal

BATCH = 4


def _data(batches: int) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    n = batches * BATCH
    x, y = torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH)


class Net(pl.LightningModule):
    """A classifier; ``branch`` runs only on even batches (an early micro-batch's branch)."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = not manual
        self.trunk = nn.Linear(6, 8)
        self.branch = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)
        self.consumed: list[dict] = []

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = torch.relu(self.trunk(x))
        return self.head(h + self.branch(h) if use_branch else h)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x, batch_idx % 2 == 0), y)
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=0.05, gradient_clip_algorithm="norm")
        opt.step()
        return loss.detach()

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        Consumed(opt, self, self.consumed)
        return opt


class GAN(pl.LightningModule):
    """Generator and discriminator, stepped both per batch or on alternate batches."""

    def __init__(self, alternate: bool) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.alternate = alternate
        self.gen = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 6))
        self.disc = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1))
        self.consumed: list[dict] = []
        self.order: list[str] = []  # which optimizer each optimizer step was

    def training_step(self, batch, batch_idx):
        real, _ = batch
        g_opt, d_opt = self.optimizers()
        z = torch.randn(real.shape[0], 4)
        bce = nn.functional.binary_cross_entropy_with_logits
        fake = self.gen(z)
        if not self.alternate or batch_idx % 2 == 0:
            d_loss = bce(self.disc(real), torch.ones(len(real), 1)) + bce(
                self.disc(fake.detach()), torch.zeros(len(real), 1)
            )
            d_opt.zero_grad()
            self.manual_backward(d_loss)
            d_opt.step()
            self.order.append("disc")
        if not self.alternate or batch_idx % 2 == 1:
            g_loss = bce(self.disc(fake), torch.ones(len(real), 1))
            g_opt.zero_grad()
            self.manual_backward(g_loss)
            g_opt.step()
            self.order.append("gen")

    def configure_optimizers(self):
        g_opt = torch.optim.Adam(self.gen.parameters(), lr=1e-2)
        d_opt = torch.optim.SGD(self.disc.parameters(), lr=1e-2, momentum=0.5)
        Consumed(g_opt, self, self.consumed)
        Consumed(d_opt, self, self.consumed)
        return g_opt, d_opt


def _fit(root, model: pl.LightningModule, batches: int, observe: bool, **kw):
    torch.manual_seed(0)
    callbacks = [StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))]
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=callbacks if observe else [],
        **kw,
    )
    trainer.fit(model, _data(batches))
    return trainer


def _twin(tmp_path, make, batches: int, **kw):
    """The observed run's module and trainer, checked bitwise against an unobserved twin."""
    torch.manual_seed(0)
    seen = make()
    trainer = _fit(tmp_path / "seen", seen, batches, True, **kw)
    torch.manual_seed(0)
    twin = make()
    twin_trainer = _fit(tmp_path / "twin", twin, batches, False, **kw)
    assert state_equal(seen.state_dict(), twin.state_dict())
    for a, b in zip(trainer.optimizers, twin_trainer.optimizers):
        assert optimizer_state_equal(a.state_dict(), b.state_dict())
    return seen, trainer, str(tmp_path / "seen" / "stepscope")


def _names(module: nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters()]


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_gradient_clip_val_rows_are_the_clipped_gradients(tmp_path, precision):
    """The rows used to be the pre-clip gradients (Lightning clips inside its closure),
    while the step said clipped=yes; with accumulation the branch of an early micro-batch was
    site_absent."""
    model, trainer, run = _twin(
        tmp_path, Net, 6, gradient_clip_val=0.05, accumulate_grad_batches=2, precision=precision
    )
    assert trainer.global_step == 3 and len(model.consumed) == 3
    for consumed in model.consumed:  # the oracle saw clipped gradients
        assert sum(v[2] for v in consumed.values()) ** 0.5 == pytest.approx(0.05, rel=1e-4)
        assert "branch.weight" in consumed
    assert_rows_are_consumed(run, model.consumed, _names(model))
    blocks = ss.open_run(run).step_blocks()
    assert [b.truth.clipped.value for b in blocks] == ["yes"] * 3


def test_manual_optimization_records_the_consumed_gradients(tmp_path):
    """Every gradient row used to be site_absent (the backward ran before opt.step)."""
    model, trainer, run = _twin(tmp_path, lambda: Net(manual=True), 3)
    assert trainer.global_step == 3
    assert_rows_are_consumed(run, model.consumed, _names(model))
    reader = ss.open_run(run)
    assert [b.truth.applied.value for b in reader.step_blocks()] == ["yes"] * 3


@pytest.mark.parametrize("alternate", [False, True], ids=["both_per_batch", "alternate"])
def test_a_gan_records_every_optimizer_step_of_both_optimizers(tmp_path, alternate):
    """Only the first optimizer used to be watched (the second's steps said applied=no,
    with no update rows), and two steps per batch stopped recording. Now each optimizer step is
    one recorded step: its optimizer's gradients and updates, the other's parameters unstepped."""
    batches = 4 if alternate else 2
    model, trainer, run = _twin(tmp_path, lambda: GAN(alternate), batches)
    steps = len(model.order)
    assert trainer.global_step == steps == 4
    reader = ss.open_run(run)
    assert reader.steps.tolist() == list(range(steps))
    assert [b.truth.applied.value for b in reader.step_blocks()] == ["yes"] * steps
    names = _names(model)
    for step, who in enumerate(model.order):
        # the stepped optimizer's rows are what it consumed (the other optimizer's parameters
        # were not stepped: their gradient rows are "as left", see docs/collect.md)
        mine = [n for n in names if n.startswith(who)]
        assert_rows_are_consumed(run, [model.consumed[step]], mine, steps=[step])
        rows = update_presence(run, step)
        observed = sorted(n for n, (p, _) in rows.items() if p == "observed")
        assert observed == sorted(n for n in names if n.startswith(who)), (step, who)
    examples = [b.examples_seen for b in reader.step_blocks()]
    per_batch = 1 if alternate else 2
    assert examples == [BATCH * (1 + i // per_batch) for i in range(steps)]
    np.testing.assert_array_equal(reader.steps, np.arange(steps))

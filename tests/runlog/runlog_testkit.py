"""A stochastic-depth toy model and an SGD + StepLR loop that logs through any run log."""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

STEPS, BATCH, STEPS_PER_EPOCH = 12, 16, 4


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(h))


class SDNet(torch.nn.Module):
    """Residual blocks; block 1 drops per example (row mode), block 2 whole batches."""

    def __init__(self, width: int = 8, depth: int = 3) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, width)
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, 3)

    def forward(self, x: torch.Tensor, row_keep: torch.Tensor, block2_runs: bool) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = h + self.blocks[0](h)
        h = h + row_keep[:, None].to(h.dtype) * self.blocks[1](h)
        if block2_runs:  # skipped for the whole batch: block 2 does not run at all
            h = h + self.blocks[2](h)
        return self.head(h)


def survival(step: int) -> float:
    """The user's stochastic-depth schedule for block 1 (linear decay)."""
    return 1.0 - 0.04 * step


@dataclass
class Truth:
    loss: dict = field(default_factory=dict)
    lr: dict = field(default_factory=dict)
    survival: dict = field(default_factory=dict)
    row_active: dict = field(default_factory=dict)  # step -> active examples of block 1
    block2_runs: dict = field(default_factory=dict)
    grad_sq: dict = field(default_factory=dict)  # step -> sum of squares of blocks.2.fc.weight.grad
    val_ce: dict = field(default_factory=dict)


def train(make, *, set_to_none: bool = True, masks: bool = True, seed: int = 0):
    """Train SDNet with SGD + momentum and a StepLR schedule, logging every value.

    ``make(model, optimizer)`` returns ``(log, step_ctx)``: the object whose ``log``,
    ``log_mask`` and ``log_eval`` are called, and ``step_ctx(examples, epoch)`` giving the step
    context manager.
    """
    torch.manual_seed(seed)
    model = SDNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    log, step_ctx = make(model, opt)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    g = torch.Generator().manual_seed(seed + 1)  # data
    sd = torch.Generator().manual_seed(seed + 2)  # stochastic depth: its own stream
    vx, vy = torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)
    truth = Truth()
    ones = torch.ones(64, dtype=torch.bool)

    def evaluate(step):
        with torch.no_grad():
            ce = F.cross_entropy(model(vx, ones, True), vy)
        truth.val_ce[step] = float(ce)
        log.log_eval("validation", {"ce": ce}, sample_count=64, data_hash="val:seed0", epoch=None)

    evaluate(0)
    for step in range(STEPS):
        x, y = torch.randn(BATCH, 4, generator=g), torch.randint(0, 3, (BATCH,), generator=g)
        p = survival(step)
        keep = torch.rand(BATCH, generator=sd) < p
        runs = bool(torch.rand((), generator=sd) < 0.5) or step == 0
        with step_ctx(BATCH, step // STEPS_PER_EPOCH):
            loss = F.cross_entropy(model(x, keep, runs), y)
            opt.zero_grad(set_to_none=set_to_none)
            loss.backward()
            g2 = model.blocks[2].fc.weight.grad
            truth.grad_sq[step] = None if g2 is None else float(g2.double().pow(2).sum())
            opt.step()
            log.log("loss", loss)
            log.log("lr", opt.param_groups[0]["lr"])
            log.log("branch/blocks.1/survival_probability", p)
            if masks:
                log.log_mask("blocks.1", keep, nominal_macs_per_unit=8 * 8)
                log.log_mask("blocks.2", torch.tensor([runs]), nominal_macs_per_unit=BATCH * 64)
        truth.loss[step] = float(loss.detach())
        truth.lr[step] = opt.param_groups[0]["lr"]
        truth.survival[step] = p
        truth.row_active[step] = int(keep.sum())
        truth.block2_runs[step] = runs
        sched.step()
        if (step + 1) % STEPS_PER_EPOCH == 0:
            evaluate(step + 1)
    log.log_eval("test", {"ce": 0.5}, sample_count=100, endpoint=True)
    return truth

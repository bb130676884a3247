"""Which forwards reach a step's activation rows, and what makes a new series.

Regression tests: a varying sequence length is not topology drift;
evaluation forwards (``no_grad``, ``inference_mode``, in either module mode) and checkpoint
recomputes never reach the step's rows, micro-batches do. Expected numbers come from the test's
own forward hooks.
"""

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from stepscope import open_run
from stepscope.collect import Cadence, HistoryCollector, WatchSettings
from tests.collect.models import Numbers, close, spine_numbers


def activation_row(c, site, step):
    for rb in c.ring.blocks():
        if rb.block.optimizer_step == step:
            for b in rb.batches:
                if b.stream.value == "activation":
                    for j, sid in enumerate(b.site_ids):
                        if c.sites[int(sid)].name == site:
                            return spine_numbers(b.spines[j])
    raise AssertionError(f"no activation row for {site} at {step}")


def test_transformer_encoder_over_varying_lengths_keeps_one_series_per_site(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    c = HistoryCollector(
        model, cadence=1, settings=WatchSettings(output_dir=str(tmp_path / "t"), commit_steps=4)
    )
    g = torch.Generator().manual_seed(0)
    for length in [8, 63, 17, 40, 9, 33, 25, 12]:
        with c.step(opt):
            loss = model(torch.randn(2, length, 16, generator=g)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    c.close()
    h = open_run(tmp_path / "t")
    assert all(s.ended_step is None for s in h.sites)
    assert len(h.sites) == len({r.site for r in c.rows})
    totals = h.series("layers.0.linear2", "activation", "total").values
    assert list(totals) == [2 * n * 16 for n in [8, 63, 17, 40, 9, 33, 25, 12]]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def own_hook(module, store):
    return module.register_forward_hook(lambda m, i, o: store.append(o.detach().clone()))


def test_implicit_spelling_does_not_fold_a_no_grad_evaluation_in_train_mode():
    # the docs/runlog.md loop: evaluate under no_grad without model.eval()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, cadence=1, optimizer=opt)
    seen = []
    handle = None
    for step in range(3):
        x = torch.randn(5, 3)
        handle = own_hook(model.a, seen)
        loss = model(x).pow(2).mean()
        handle.remove()
        with torch.no_grad():
            model(torch.randn(7, 3))
        with torch.inference_mode():
            model(torch.randn(9, 3))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert close(activation_row(c, "a", step), Numbers.of([seen[-1]]))
    c.close()


def test_evaluations_inside_the_transaction_in_eval_mode_are_not_the_steps():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, cadence=1)
    seen = []
    with c.step(opt):
        handle = own_hook(model.b, seen)
        loss = model(torch.randn(5, 3)).pow(2).mean()
        handle.remove()
        model.eval()
        with torch.no_grad():
            model(torch.randn(6, 3))
        model.train()
        opt.zero_grad()
        loss.backward()
        opt.step()
    c.close()
    assert close(activation_row(c, "b", 0), Numbers.of(seen))


def test_micro_batches_merge_into_the_step_and_checkpoint_recomputes_do_not():
    class Ckpt(torch.nn.Module):
        def __init__(self, reentrant):
            super().__init__()
            self.inp = torch.nn.Linear(3, 6)
            self.block = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU())
            self.head = torch.nn.Linear(6, 1)
            self.reentrant = reentrant

        def forward(self, x):
            h = checkpoint(self.block, self.inp(x), use_reentrant=self.reentrant)
            return self.head(h)

    for reentrant in (False, True):
        torch.manual_seed(0)
        model = Ckpt(reentrant)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        c = HistoryCollector(model, sites=["block.0", "block.1"], cadence=Cadence(1, 1))
        seen = {"block.0": [], "block.1": []}
        for step in range(2):
            with c.step(opt):
                opt.zero_grad()
                handles = [own_hook(model.block[i], seen[f"block.{i}"]) for i in (0, 1)]
                micro = [torch.randn(4, 3), torch.randn(2, 3)]
                outs = [model(x) for x in micro]  # two micro-batches
                for h in handles:
                    h.remove()
                for out in outs:
                    out.pow(2).mean().backward()  # recomputes happen here
                opt.step()
            for site in seen:
                want = Numbers.of(seen[site][-2:])
                assert want.numel == 6 * 6
                assert close(activation_row(c, site, step), want), (reentrant, site, step)
        c.close()


def test_plan_is_known_for_sites_that_never_ran():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    c = HistoryCollector(model, streams=("activation",), cadence=1)
    with c.step():
        model[0](torch.randn(3, 2))  # the dropout never runs
    plan = c.plan()
    c.close()
    assert plan.total_elements == 6
    assert "?" not in str(plan)
    assert np.all([s.signature for s in c.sites] == ["float32[*,*]", "not_run"])


def test_series_of_a_module_that_never_runs_reads_site_absent_every_step(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    model.spare = torch.nn.ModuleList([torch.nn.Linear(2, 2)])  # registered, never called
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(
        model, sites="*", cadence=1, settings=WatchSettings(output_dir=str(tmp_path / "n"))
    )
    for _ in range(3):
        with c.step(opt):
            model[0](torch.randn(4, 2)).sum().backward()
            opt.step()
    c.close()
    h = open_run(tmp_path / "n")
    for site in ("spare", "spare.0"):
        s = h.series(site, "activation", "total")
        assert list(s.presence_names()) == ["site_absent"] * 3
    grads = h.series("spare.0.weight", "gradient", "total")
    assert list(grads.presence_names()) == ["site_absent"] * 3


def test_quiet_steps_return_early_yet_a_module_first_run_then_is_recorded_when_due(tmp_path):
    """Between due steps the activation hooks return at once (every row discovered); a module
    that first runs on such a step is still discovered and recorded on the next due step."""

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, use_b: bool) -> torch.Tensor:
            h = self.a(x)
            return self.b(h) if use_b else h

    torch.manual_seed(0)
    net = Branchy()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    seen: dict[int, float] = {}  # an independent hook: b's output sum, in float64
    step = 0
    net.b.register_forward_hook(lambda m, i, o: seen.__setitem__(step, o.double().sum().item()))
    c = HistoryCollector(
        net,
        sites="*",
        streams=("activation",),
        cadence=Cadence(10, None),
        settings=WatchSettings(output_dir=str(tmp_path / "run")),
    )
    calls = []
    for step in range(21):
        with c.step(opt, examples=2):
            net(torch.randn(2, 4), use_b=step >= 3).sum().backward()
            opt.step()
            opt.zero_grad()
            calls.append(c._open.state.hook_calls)
    c.close()
    h = open_run(tmp_path / "run")
    s = h.series("b", "activation", "sum")
    # step 0: b had not run (a site_absent row, no value); first run at step 3 (a quiet step):
    # recorded at the next due steps, equal to the independent hook
    assert s.steps.tolist() == [0, 10, 20]
    assert not np.isfinite(s.values[0])
    np.testing.assert_allclose(s.values[1:], [seen[10], seen[20]], rtol=1e-6)
    assert calls[5] == calls[15] > 0  # quiet steps still count their hook calls (auto cadence)


def test_quiet_steps_take_the_module_hooks_off_and_keep_the_order_of_hooks(tmp_path):
    """On a quiet step a module whose only forward hook is the collector's runs hook-free (torch's
    fast path); a module with another hook keeps the collector's; a hook registered during a
    quiet step still runs after the collector's on a due step, as it would have without the rest."""
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    b_seen: dict[int, float] = {}
    step = 0
    net.b.register_forward_hook(lambda m, i, o: b_seen.__setitem__(step, o.double().sum().item()))
    c = HistoryCollector(
        net,
        streams=("activation",),
        cadence=Cadence(5, None),
        settings=WatchSettings(output_dir=str(tmp_path / "run")),
    )
    a_seen: dict[int, float] = {}
    hooks_on_a = []

    def doubling(m, i, o):  # changes a's output: the collector must record what a returned
        a_seen[step] = o.double().sum().item()
        return o * 2

    for step in range(11):
        if step == 2:  # a quiet step: registered while the collector's hook is off
            net.a.register_forward_hook(doubling)
        hooks_on_a.append(len(net.a._forward_hooks))
        with c.step(opt):
            net(torch.randn(2, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
    c.close()
    # step 0 discovers (hooks on); off on a at quiet step 1, on again (in front) at due step 5;
    # from then on a has another hook too, so the collector's stays
    assert hooks_on_a == [1, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2]
    assert len(net.a._forward_hooks) == 1 and len(net.b._forward_hooks) == 1  # ours removed
    h = open_run(tmp_path / "run")
    a, b = h.series("a", "activation", "sum"), h.series("b", "activation", "sum")
    assert a.steps.tolist() == b.steps.tolist() == [0, 5, 10]
    np.testing.assert_allclose(a.values[1:], [a_seen[5], a_seen[10]], rtol=1e-6)
    np.testing.assert_allclose(b.values, [b_seen[0], b_seen[5], b_seen[10]], rtol=1e-6)

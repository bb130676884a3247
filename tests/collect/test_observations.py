"""What the collector records, checked against independent captures of the same tensors."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stepscope import Refusal, open_run
from stepscope import transfer as transfer_mod
from stepscope.collect import ALL_STREAMS, Cadence, HistoryCollector, WatchSettings
from stepscope.stats import SPINE_FIELDS, Histogram, RunningStats
from tests.collect.collect_testkit import SmallNet, batches


def run(model, opt, data, collector, explicit=True):
    for x, y in data:
        if explicit:
            with collector.step(opt, examples=len(y), epoch=0):
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        else:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def test_every_stream_matches_hand_captured_tensors(small_net, tmp_path):
    """Independent capture: our own hooks and snapshots, reduced with RunningStats/Histogram."""
    model, data = small_net, batches(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    captured: dict = {}
    model.bn.register_forward_hook(
        lambda m, i, o: captured.setdefault("act", []).append(o.detach().clone())
    )
    c = HistoryCollector(
        model,
        sites=["bn", "fc"],
        streams=ALL_STREAMS,
        cadence=Cadence(1, 1),
        settings=WatchSettings(output_dir=str(tmp_path / "r")),
    )
    grads, before, after = [], [], []
    for x, y in data:
        with c.step(opt, examples=len(y)):
            out = model(x)
            out.retain_grad()
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            grads.append(model.fc.weight.grad.detach().clone())
            before.append(model.fc.weight.detach().clone())
            opt.step()
            after.append(model.fc.weight.detach().clone())
            captured.setdefault("out_grad", []).append(out.grad.detach().clone())
    c.close()
    h = open_run(tmp_path / "r")

    def spine_at(site, stream, step):
        vec = [h.series(site, stream, f).values[step] for f in SPINE_FIELDS]
        return RunningStats.from_vector(np.array(vec))

    for step in range(3):
        cases = {
            ("bn", "activation"): captured["act"][step],
            ("fc.weight", "gradient"): grads[step],
            ("fc.weight", "parameter"): after[step],
            ("fc.weight", "update"): after[step] - before[step],  # 40*10 elements < 4096: exact
            ("fc", "activation_grad"): captured["out_grad"][step],
        }
        for (site, stream), tensor in cases.items():
            ref = RunningStats()
            ref.update(tensor)
            got = spine_at(site, stream, step)
            assert (
                got.total == ref.total and got.zero == ref.zero and got.negative == ref.negative
            ), (site, stream)
            assert got.min == ref.min and got.max == ref.max, (site, stream)
            assert got.sum == pytest.approx(ref.sum, rel=1e-9, abs=1e-12), (site, stream)
            assert got.m2 == pytest.approx(ref.m2, rel=1e-9, abs=1e-15), (site, stream)
            hist = h.histograms(site, stream)
            ref_h = Histogram()
            ref_h.update(tensor)
            assert hist.histogram(step) == ref_h, (site, stream)
    steps = h.step_blocks()
    assert [b.examples_seen for b in steps] == [8, 16, 24]
    assert all(b.truth.applied.value == "yes" for b in steps)


def test_update_channel_is_a_seeded_subvector_of_the_true_change(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(100, 80)  # 8000 weights > 4096: sampled
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    rng = torch.get_rng_state()
    c = HistoryCollector(
        model,
        sites="Linear",
        streams=("update",),
        cadence=1,
        settings=WatchSettings(output_dir=str(tmp_path / "u")),
    )
    assert torch.equal(
        rng, torch.get_rng_state()
    )  # the private generator left the global RNG alone
    x = torch.randn(16, 100)
    with c.step(opt):
        before = model.weight.detach().clone()
        model(x).pow(2).mean().backward()
        opt.step()
    full = (model.weight.detach() - before).reshape(-1)
    c.close()
    h = open_run(tmp_path / "u")
    total = h.series("weight", "update", "total").values[0]
    assert total == 4096
    lo, hi = (
        h.series("weight", "update", "min").values[0],
        h.series("weight", "update", "max").values[0],
    )
    assert full.min() <= lo <= hi <= full.max()
    obs = h.observations("weight", "update") if hasattr(h, "observations") else None
    assert obs is not None
    # exact when the sample covers the parameter: the bias (80 elements)
    assert h.series("bias", "update", "total").values[0] == 80
    plan = {(r.site, r.stream): r for r in c.plan().rows}
    assert plan[("weight", "update")].estimated and not plan[("bias", "update")].estimated


def test_transfers_per_step_do_not_grow_with_sites(monkeypatch):
    def transfers_per_step(width: int) -> int:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(width)])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        c = HistoryCollector(model, sites="*", streams=ALL_STREAMS, cadence=1)
        calls = []
        real = transfer_mod.to_host  # the one device-to-host copy (staging and run log)
        monkeypatch.setattr(transfer_mod, "to_host", lambda t: calls.append(t.shape) or real(t))
        item_calls = []
        monkeypatch.setattr(
            torch.Tensor, "item", lambda self: item_calls.append(1) or float(self.sum())
        )
        with c.step(opt):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            c.log("loss", torch.tensor(1.0))
        monkeypatch.undo()
        c.close()
        assert item_calls == []
        return len(calls)

    # spine rows, histogram rows (step 0 is a histogram step) and the user scalars: three copies
    assert transfers_per_step(3) == transfers_per_step(30) == 3


def test_both_spellings_record_the_same_activation_rows(tmp_path):
    def spines(explicit):
        torch.manual_seed(0)
        model = SmallNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        c = HistoryCollector(
            model,
            sites="*",
            streams=("activation",),
            cadence=1,
            settings=WatchSettings(output_dir=str(tmp_path / str(explicit))),
            optimizer=None if explicit else opt,
        )
        torch.manual_seed(5)
        run(model, opt, batches(4), c, explicit=explicit)
        c.close()
        h = open_run(tmp_path / str(explicit))
        prov = {b.provenance.value for b in h.step_blocks()}
        return {s.name: h.series(s.name, "activation", "sum_squares").values for s in h.sites}, prov

    a, pa = spines(True)
    b, pb = spines(False)
    assert pa == {"explicit"} and pb == {"implicit"}
    assert a.keys() == b.keys() and len(a) == 4
    for k in a:
        assert len(a[k]) == 4 and np.array_equal(a[k], b[k]), k


def test_skipped_optimizer_step_records_no_update(small_net, tmp_path):
    opt = torch.optim.SGD(small_net.parameters(), lr=0.1)
    c = HistoryCollector(
        small_net,
        sites="fc",
        streams=("gradient", "update"),
        cadence=1,
        settings=WatchSettings(output_dir=str(tmp_path / "s")),
    )
    x, y = batches(1)[0]
    with c.step(opt):  # e.g. a GradScaler found inf and never called optimizer.step()
        F.cross_entropy(small_net(x), y).backward()
    with c.step(opt):
        F.cross_entropy(small_net(x), y).backward()
        opt.step()
    c.close()
    h = open_run(tmp_path / "s")
    blocks = h.step_blocks()
    assert [b.truth.applied.value for b in blocks] == ["no", "yes"]
    upd = h.series("fc.weight", "update", "total")
    assert list(upd.steps) == [1]  # no row at all for the skipped step: no fake update
    # gradients are still observed at the skipped step, with the stage they were taken at
    assert list(h.series("fc.weight", "gradient", "total", phase="backward").steps) == [0]
    assert list(h.series("fc.weight", "gradient", "total", phase="pre_step").steps) == [1]


def test_histograms_only_on_histogram_steps_and_absent_sites(tmp_path):
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

        def forward(self, x, use_b):
            x = self.a(x)
            return self.b(x) if use_b else x

    torch.manual_seed(0)
    m = Gate()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    c = HistoryCollector(
        m,
        sites="*",
        streams=("activation",),
        cadence=Cadence(1, 2),
        settings=WatchSettings(output_dir=str(tmp_path / "g")),
    )
    for step in range(4):
        with c.step(opt):
            m(torch.randn(2, 3), use_b=step != 1).sum().backward()
            opt.step()
    c.close()
    h = open_run(tmp_path / "g")
    assert list(h.histograms("a", "activation").steps) == [0, 2]
    b = h.series("b", "activation", "total")
    assert list(b.presence_names()) == ["observed", "site_absent", "observed", "observed"]
    assert np.isnan(b.values[1]) and not b.valid[1]  # missing is never zero


def test_a_rank_or_dtype_change_ends_the_series_and_a_size_change_does_not(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Identity())
    c = HistoryCollector(
        m,
        sites="0",
        streams=("activation",),
        cadence=1,
        settings=WatchSettings(output_dir=str(tmp_path / "d")),
    )
    inputs = [torch.randn(2, 3), torch.randn(4, 7), torch.randn(2, 5, 1), torch.randn(2, 5, 1)]
    for x in [*inputs, inputs[-1].double()]:
        with c.step():
            m(x)
    c.close()
    h = open_run(tmp_path / "d")
    assert [(s.name, s.signature, s.started_step, s.ended_reason) for s in h.sites] == [
        ("0", "float32[*,*]", 0, "topology_drift"),
        ("0", "float32[*,*,*]", 2, "topology_drift"),
        ("0", "float64[*,*,*]", 4, None),
    ]
    # sizes are not structure, but every step's size is recorded
    assert list(h.series(h.sites[0], "activation", "total").values) == [6, 28]


def test_ram_only_refuse_policy_raises_before_losing_data(small_net):
    opt = torch.optim.SGD(small_net.parameters(), lr=0.1)
    c = HistoryCollector(
        small_net,
        sites="fc",
        streams=("parameter",),
        cadence=1,
        settings=WatchSettings(in_memory=True, ram_capacity=2),
    )
    x, y = batches(1)[0]
    with pytest.raises(Refusal) as err:
        for _ in range(3):
            with c.step(opt):
                F.cross_entropy(small_net(x), y).backward()
                opt.step()
    assert err.value.code == "ring_capacity_exhausted"
    assert [b.step_lo for b in c.ring.blocks()] == [0, 1]  # nothing already held was lost


def test_user_scalars_land_at_their_step(small_net, tmp_path):
    opt = torch.optim.SGD(small_net.parameters(), lr=0.1)
    c = HistoryCollector(
        small_net,
        sites="fc",
        streams=("parameter",),
        settings=WatchSettings(output_dir=str(tmp_path / "l")),
    )
    losses = []
    for x, y in batches(3):
        with c.step(opt) as st:
            loss = F.cross_entropy(small_net(x), y)
            loss.backward()
            opt.step()
            st.log("loss", loss)
            c.log("lr", 0.1)
            losses.append(loss.item())
    c.close()
    h = open_run(tmp_path / "l")
    assert h.scalars("loss").values.tolist() == pytest.approx(losses, rel=1e-7)
    assert h.scalars("lr").values.tolist() == [0.1, 0.1, 0.1]


def test_an_evaluation_inside_the_step_is_not_folded_into_its_activation_rows(small_net, tmp_path):
    opt = torch.optim.SGD(small_net.parameters(), lr=0.1)
    c = HistoryCollector(
        small_net,
        sites="fc",
        streams=("activation",),
        cadence=1,
        settings=WatchSettings(output_dir=str(tmp_path / "e")),
    )
    x, y = batches(1)[0]
    with c.step(opt):
        F.cross_entropy(small_net(x), y).backward()
        opt.step()
        small_net.eval()
        with torch.no_grad():
            small_net(torch.randn(3, 1, 6, 6))  # an evaluation: eval mode, no graph
        small_net.train()
    c.close()
    total = open_run(tmp_path / "e").series("fc", "activation", "total").values
    assert total.tolist() == [8 * 10]  # the training batch only (8 examples x 10 logits)

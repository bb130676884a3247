"""The update channel names its estimates per row, and UpdateRatioCheck compares like with like.

Truth: the test snapshots every parameter around ``optimizer.step()`` and computes the whole
update's l2 and the parameter's l2 itself.
"""

from __future__ import annotations

import math

import torch

import stepscope as ss
from stepscope.events import ObserverEvent, UpdateRatioCheck
from tests.collect.models import TinyGPT

SAMPLE = 256


class Keep:
    """A subscriber that keeps every event it is given."""

    def __init__(self) -> None:
        self.events: list = []

    def on_events(self, events):
        self.events.extend(events)

    def close(self) -> None:
        pass


def _run(tmp_path, steps=4):
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    bus = ss.EventBus(capacity=10)
    keep = bus.subscribe(Keep())
    bus.subscribe(UpdateRatioCheck(lower=0.0, upper=float("inf")))
    settings = ss.WatchSettings(
        output_dir=str(tmp_path / "r"),
        durable=False,
        update_sample_size=SAMPLE,
        event_bus=bus,
    )
    named = dict(model.named_parameters())
    truth: dict[tuple[str, int], float] = {}
    g = torch.Generator().manual_seed(7)
    with ss.HistoryCollector(model, cadence=1, settings=settings) as c:
        for step in range(steps):
            x = torch.randint(0, 40, (3, 9), generator=g)
            with c.step(opt, examples=3):
                opt.zero_grad()
                out = model(x)
                torch.nn.functional.cross_entropy(out.reshape(-1, 40), x.reshape(-1)).backward()
                before = {n: p.detach().clone() for n, p in named.items()}
                opt.step()
                for n, p in named.items():
                    du = (p.detach() - before[n]).double().norm()
                    truth[(n, step)] = float(du / p.detach().double().norm())
    return keep.events, truth, named


def test_update_rows_say_estimated_per_row_and_events_carry_it(tmp_path):
    events, _, named = _run(tmp_path)
    l2 = [e for e in events if e.name.startswith("update.post_step/") and e.field == "l2"]
    assert l2
    for e in l2:
        sampled = named[e.site].numel() > SAMPLE
        assert e.estimated is sampled, (e.site, named[e.site].numel())
    assert {e.estimated for e in l2} == {True, False}  # both kinds are present
    for e in l2:  # the flag survives JSON (trackers, JSONL export)
        assert ObserverEvent.from_dict(e.to_dict()).estimated is e.estimated
    obs = ss.open_run(tmp_path / "r").observations(stream="update")
    for r in obs:
        name = ss.open_run(tmp_path / "r").sites[r.site_id].name
        sampled = named[name].numel() > SAMPLE
        assert (f"update_sampled:{SAMPLE}" in r.disclosures) is sampled, name
    # other streams never say estimated
    assert not any(
        e.estimated for e in events if e.stream is not None and e.stream.value != "update"
    )


def test_update_ratio_of_a_sampled_weight_estimates_the_whole_tensors_ratio(tmp_path):
    events, truth, named = _run(tmp_path)
    ratios = [e for e in events if e.name.startswith("update_ratio/") and e.value is not None]
    assert ratios
    seen_sampled = 0
    for e in ratios:
        want = truth[(e.site, e.optimizer_step)]
        if named[e.site].numel() > SAMPLE:
            assert e.estimated
            # a 256-element sample of a 1280-4096 element update: within 25% of the truth
            # (before: sqrt(numel/256) = 2.2x-4x too small)
            assert abs(e.value / want - 1) < 0.25, (e.site, e.value, want)
            seen_sampled += 1
        else:
            assert not e.estimated
            assert math.isclose(e.value, want, rel_tol=1e-5), (e.site, e.value, want)
    assert seen_sampled >= 8

"""The RAM ring is opt-in (``in_memory=True``); its refusal names the disk spelling a new user needs."""

from __future__ import annotations

import pytest
import torch

import stepscope as ss
from tests.collect.models import LSTMTagger


def test_the_ram_ring_refusal_names_the_disk_first_spelling():
    model = LSTMTagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = ss.WatchSettings(in_memory=True, ram_capacity=2)
    with ss.HistoryCollector(model, settings=settings) as c:
        with pytest.raises(ss.Refusal) as err:
            for _ in range(3):
                with c.step(opt, examples=1):
                    model(torch.randint(0, 30, (1, 4))).sum().backward()
                    opt.step()
    assert err.value.code == "ring_capacity_exhausted"
    assert 'WatchSettings(name="<name>")' in err.value.remedies[0]

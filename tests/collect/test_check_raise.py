"""A check with ``action="raise"`` stops the user's step with ``check_failed`` and nothing more:
the step it judged is written, and the collector goes on recording the next steps."""

from __future__ import annotations

import pytest
import torch

import stepscope as ss
from stepscope.events import CheckFailed, GradientNormCheck
from tests.collect.models import LSTMTagger


@pytest.mark.parametrize("spelling", ["explicit", "implicit"])
def test_a_raising_check_leaves_the_collector_usable(tmp_path, spelling):
    torch.manual_seed(0)
    model = LSTMTagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    bus = ss.EventBus()
    bus.subscribe(GradientNormCheck(lower=0.0, upper=1e-12, action="raise"))  # always fires
    settings = ss.WatchSettings(
        output_dir=str(tmp_path / "r"), durable=False, commit_steps=1, event_bus=bus
    )
    g = torch.Generator().manual_seed(2)
    raised = 0
    kwargs = {"optimizer": opt} if spelling == "implicit" else {}
    with ss.HistoryCollector(model, cadence=1, settings=settings, **kwargs) as c:
        for _ in range(4):
            x = torch.randint(0, 30, (3, 7), generator=g)
            y = torch.randint(0, 4, (3, 7), generator=g)
            try:
                if spelling == "explicit":
                    with c.step(opt, examples=3):
                        opt.zero_grad()
                        out = model(x)
                        torch.nn.functional.cross_entropy(
                            out.reshape(-1, 4), y.reshape(-1)
                        ).backward()
                        opt.step()
                else:
                    opt.zero_grad()
                    out = model(x)
                    torch.nn.functional.cross_entropy(out.reshape(-1, 4), y.reshape(-1)).backward()
                    opt.step()
            except CheckFailed as err:
                assert err.code == "check_failed"
                raised += 1
        assert not c.closed
    assert raised == 4
    blocks = ss.open_run(tmp_path / "r").step_blocks()
    assert [b.optimizer_step for b in blocks] == [0, 1, 2, 3]

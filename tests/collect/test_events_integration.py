"""The collector publishes each step's rows on an EventBus; checks see them without re-scanning."""

import warnings

import torch
import torch.nn.functional as F

import stepscope as ss
from stepscope.collect import Cadence, HistoryCollector, WatchSettings
from stepscope.events import NonFiniteCheck


def test_nonfinite_check_names_the_first_step_and_site_of_an_injected_nan(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    bus = ss.EventBus(capacity=10_000)
    check = bus.subscribe(NonFiniteCheck(action="stop"))
    c = HistoryCollector(
        model,
        sites="*",
        streams=("activation", "parameter"),
        cadence=Cadence(1, 5),
        settings=WatchSettings(output_dir=str(tmp_path / "r"), event_bus=bus),
    )
    stopped_at = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(8):
            if step == 4:
                with torch.no_grad():
                    model[2].weight[0, 0] = float("nan")  # corrupts layer 2's output from step 4 on
            x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
            with c.step(opt, examples=5):
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            if check.should_stop:
                stopped_at = step
                break
    c.close()
    assert stopped_at == 4
    first = check.first
    assert first.optimizer_step == 4
    assert first.site == "2" and first.stream.value == "activation"
    # the artifact agrees: layer 0 clean, layer 2 non-finite at step 4
    h = ss.open_run(tmp_path / "r")
    assert h.series("0", "activation", "nan").values[4] == 0
    assert h.series("2", "activation", "nan").values[4] > 0
    hist_steps = sorted({e.optimizer_step for e in bus.recent("histogram_counts")})
    assert hist_steps == [0]  # Cadence(1, 5): histograms at step 0 (the run stopped at step 4)
